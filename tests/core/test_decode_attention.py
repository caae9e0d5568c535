"""The decode-step fast paths keep the model's function: the grouped one-token attention equals SDPA (masks and
padding included), the int8 cache hands it float32 at decode, and switching adapters off by flag gives exactly
peft's `disable_adapter()` output and restores the adapter afterwards, also after an error."""
import pytest
import torch
from torch.nn import functional as F

from core.adapters import lora as adapters
from core.decode.attention import NAME, decode_attention
from core.decode.cache import new_cache
from core.engine import Engine
from tests.tiny import make_model, make_tokenizer


class GQA(torch.nn.Module):
    num_key_value_groups = 7


def reference(q, k, v, mask):
    """float64 SDPA with the KV heads repeated (what transformers' SDPA path computes)."""
    k, v = k.double().repeat_interleave(7, 1), v.double().repeat_interleave(7, 1)
    mask = mask if mask is None or mask.dtype == torch.bool else mask.double()
    return F.scaled_dot_product_attention(q.double(), k, v, attn_mask=mask).transpose(1, 2)


@pytest.mark.parametrize("masked", ["none", "bool", "float"])
def test_one_token_attention_equals_sdpa(masked):
    torch.manual_seed(0)
    q = torch.randn(3, 14, 1, 64).to(torch.bfloat16)
    k, v = torch.randn(3, 2, 50, 64).to(torch.bfloat16), torch.randn(3, 2, 50, 64).to(torch.bfloat16)
    keep = torch.ones(3, 1, 1, 50, dtype=torch.bool)
    keep[1, ..., :7] = False  # a left-padded row
    mask = {"none": None, "bool": keep, "float": torch.zeros(3, 1, 1, 50).masked_fill(~keep, float("-inf"))}[masked]
    out, weights = decode_attention(GQA(), q, k, v, mask, scaling=64 ** -0.5)
    assert weights is None and out.shape == (3, 1, 14, 64) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference(q, k, v, mask), atol=1e-2, rtol=1e-2)


def test_longer_queries_and_gradients_take_sdpa():
    q = torch.randn(1, 14, 5, 64, requires_grad=True)
    k, v = torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64)
    out, _ = decode_attention(GQA(), q, k, v, None, scaling=0.125, is_causal=True)
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(7, 1), v.repeat_interleave(7, 1), is_causal=True,
                                              scale=0.125).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert q.grad is not None


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_the_engine_decodes_with_it_and_the_logits_match_sdpa(kv):
    model = make_model(448).to(torch.bfloat16)
    ids = torch.randint(5, 400, (2, 9))
    ids[0, :3] = 0
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0

    def run(impl):
        model.config._attn_implementation = impl
        cache = new_cache(model.config, kv)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            return model(input_ids=torch.tensor([[7], [8]]), attention_mask=step_mask, cache=cache,
                         use_cache=True).logits[:, -1].float()

    Engine(model, make_tokenizer(), model_id="tiny", context=256)  # registers "ponder" and switches the model to it
    assert model.config._attn_implementation == NAME
    torch.testing.assert_close(run(NAME), run("sdpa"), atol=3e-2, rtol=3e-2)


def random_lora_model():
    """The tiny model with a rank-4 LoRA whose weights are random (peft's start, B = 0, would change nothing)."""
    model = adapters.attach_new(make_model(448), rank=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.3)
    return model


def test_base_by_flag_equals_peft_disable_adapter_and_restores():
    model = random_lora_model()
    engine = Engine(model, make_tokenizer(), model_id="tiny", context=256, adapter_name="reasoning")
    ids = torch.randint(5, 400, (1, 6))
    with torch.inference_mode():
        adapted = engine.model(input_ids=ids).logits
        with engine.model.disable_adapter():
            peft_base = engine.model(input_ids=ids).logits
        with engine.slots.using(None):
            flag_base = engine.model(input_ids=ids).logits
        assert torch.equal(flag_base, peft_base) and not torch.equal(flag_base, adapted)
        with pytest.raises(RuntimeError), engine.slots.using(None):
            raise RuntimeError("a failed step")
        torch.testing.assert_close(engine.model(input_ids=ids).logits, adapted)


def test_the_fast_lora_path_computes_what_peft_computes():
    from peft.tuners.lora.layer import Linear

    model = random_lora_model()
    model.eval()
    ids = torch.randint(5, 400, (2, 6))
    with torch.inference_mode():
        peft_out = model(input_ids=ids).logits
    engine = Engine(model, make_tokenizer(), model_id="tiny", context=256, adapter_name="reasoning")
    layers = [m for m in engine.model.modules() if isinstance(m, Linear)]
    assert layers and all("_peft_forward" in m.__dict__ for m in layers)  # installed on every LoRA linear
    with torch.inference_mode():
        assert torch.equal(engine.model(input_ids=ids).logits, peft_out)
    out = engine.model(input_ids=ids).logits  # with gradients: peft's own path, same function
    torch.testing.assert_close(out, peft_out)
    out.sum().backward()
    assert any(p.grad is not None for p in engine.model.parameters() if p.requires_grad)


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_lean_decoder_layers_give_transformers_logits_and_hidden_states(kv):
    from core.decode import lean_layers

    model = random_lora_model().to(torch.bfloat16).eval()
    Engine(model, make_tokenizer(), model_id="tiny", context=256, adapter_name="reasoning")
    layers = [m for m in model.modules() if "_hf_forward" in m.__dict__]
    assert layers, "the engine installs the lean layers"
    ids = torch.randint(5, 400, (2, 7))
    ids[1, :2] = 0
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :2] = 0

    def step():
        cache = new_cache(model.config, kv)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask[:, :7], cache=cache, use_cache=True)
            out = model(input_ids=torch.tensor([[9], [11]]), attention_mask=mask, cache=cache, use_cache=True,
                        output_hidden_states=True)
        return out.logits[:, -1].float(), out.hidden_states[-1][:, -1].float()

    lean = step()
    for layer in layers:  # transformers' own forward
        layer.forward = layer._hf_forward
    try:
        hf = step()
    finally:
        for layer in layers:
            del layer.__dict__["forward"], layer.__dict__["_hf_forward"]
        assert lean_layers.install(model) == len(layers)
    torch.testing.assert_close(lean[0], hf[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lean[1], hf[1], atol=2e-2, rtol=2e-2)
