"""The fused decode step computes what the module path computes, bit for bit, and the engine uses it only
where it applies."""
import copy
import os
import subprocess
import sys

import pytest
import torch

from core.adapters import lora as adapters
from core.config import SamplingConfig
from core.decode import ops
from core.decode.cache import new_cache
from core.decode.fused import FusedDecoder
from core.engine import Engine, collect
from models.quantization import quantize_model
from tests.tiny import make_model, make_tokenizer


def w4_engine() -> Engine:
    model = quantize_model(make_model(448, hidden_size=256), 4, head_bits=4)
    return Engine(model, make_tokenizer(), model_id="tiny", context=512, kv="int8")


def prefilled(model, rows: int = 1):
    cache = new_cache(model.config, "int8")
    with torch.inference_mode():
        logits = model(input_ids=torch.randint(5, 400, (1, 11), generator=torch.Generator().manual_seed(3)),
                       cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    if rows > 1:
        cache.batch_repeat_interleave(rows)
    return cache, logits


def test_fused_steps_equal_the_module_path_and_write_the_same_cache():
    engine = w4_engine()
    assert engine.fused is not None
    model = engine.model
    cache, _ = prefilled(model, rows=3)
    other = copy.deepcopy(cache)
    tokens = torch.tensor([7, 123, 301])
    for _ in range(70):
        fused = engine.fused.step(tokens, cache)
        with torch.inference_mode():
            ref = model(input_ids=tokens.view(-1, 1), cache=other, use_cache=True, logits_to_keep=1).logits[:, -1]
        assert torch.equal(fused, ref)
        tokens = ref.float().argmax(-1)
    for mine, theirs in zip(cache.layers, other.layers, strict=True):
        assert mine.length == theirs.length == 81
        assert torch.equal(mine.q[..., :81, :], theirs.q[..., :81, :])
        assert torch.equal(mine.s[..., :81, :], theirs.s[..., :81, :])


def test_the_layers_in_one_c_call_equal_the_python_driven_layers(monkeypatch):
    """core/decode/_layer_step.c runs every layer of a step in one call: the same logits and the same cache bytes as
    the layers driven op by op from Python, for one row, a few and more rows than one int4 call takes (17), with the
    buffers growing on the way. The AVX2 child process below runs it on Ponder's AVX2 layout."""
    import core.decode.fused

    engine = w4_engine()
    fused = engine.fused
    if fused.plan is None:
        pytest.skip("needs the built decode ops and int4 kernel (the C step's plan)")
    if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2":  # the child process below: Ponder's AVX2 layout
        assert all(part.data.dtype == torch.int8 for part in fused.parts())
    taken = []

    def counted(*args):
        taken.append(ops.layers_step(*args))
        return taken[-1]

    monkeypatch.setattr(core.decode.fused, "layers_step", counted)
    for rows in (1, 3, 17) if fused.plan_rows is None else (1, 3, fused.plan_rows):
        cache, _ = prefilled(engine.model, rows=rows)
        for layer in cache.layers:  # room for one more token: the buffers grow (move) on the second step
            layer.q, layer.s = layer.q[..., :12, :].clone(), layer.s[..., :12, :].clone()
        other = copy.deepcopy(cache)
        tokens = (torch.arange(rows) * 37 + 5) % 400
        for _ in range(60):
            ours = fused.step(tokens, cache)
            plan, fused.plan = fused.plan, None
            try:
                theirs = fused.step(tokens, other)
            finally:
                fused.plan = plan
            assert torch.equal(ours, theirs)
            tokens = ours.float().argmax(-1)
        for mine, reference in zip(cache.layers, other.layers, strict=True):
            end = reference.length
            assert mine.length == end == 71 and mine.q.shape[-2] > 12
            assert torch.equal(mine.q[..., :end, :], reference.q[..., :end, :])
            assert torch.equal(mine.s[..., :end, :], reference.s[..., :end, :])
    assert len(taken) == 3 * 60 and all(taken), "every step of the C side ran its layers in one C call"


def test_the_c_step_declines_what_it_cannot_read():
    """Layers at different lengths go back to the Python-driven step (same result); a plan of the wrong shape is a
    ValueError, not a crash."""
    engine = w4_engine()
    fused = engine.fused
    if fused.plan is None:
        pytest.skip("needs the built decode ops and int4 kernel (the C step's plan)")
    cache, _ = prefilled(engine.model)
    cache.layers[1].length -= 1
    h = fused.embed[torch.tensor([5])]
    cos, sin = fused._rotary(cache.layers[0].length)
    assert not ops.layers_step(fused.plan, h, cache.layers, cos, sin)
    assert [layer.length for layer in cache.layers[:2]] == [11, 10]
    with pytest.raises(ValueError):
        ops.layers_plan([1, 256, 4, 2, 64, 512] + [0] * 30, 1e-6, 0.125)
    with pytest.raises(ValueError):
        ops.layers_plan([2, 256, 4, 2, 64, 512], 1e-6, 0.125)


def test_the_c_step_runs_on_the_avx2_layout():
    """The comparison above in a process with torch's AVX2 packing (an AVX2 laptop: p32 weights, AVX2 kernels)."""
    from models import int4_kernel

    if int4_kernel._int4 is None or not int4_kernel._int4.features() >> int4_kernel._int4.ISA_P32I16 & 1:
        pytest.skip("needs the built kernel and an AVX2 CPU")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                          "layers_in_one_c_call"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-3000:]


def test_fused_step_grows_the_int8_buffers_in_place():
    engine = w4_engine()
    cache, _ = prefilled(engine.model)
    layer = cache.layers[0]
    capacity = layer.q.shape[-2]
    layer.length = capacity  # the next token needs more room than the buffers hold
    engine.fused.step(torch.tensor([5]), cache)
    assert layer.length == capacity + 1 and layer.q.shape[-2] > capacity


def test_engine_answers_are_the_same_with_and_without_the_fused_step():
    engine = w4_engine()
    calls = []
    step = engine.fused.step
    engine.fused.step = lambda tokens, cache: calls.append(len(tokens)) or step(tokens, cache)
    cfg = SamplingConfig(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.0)
    fused_text = engine.generate("What is 17*23?", cfg).text
    sampled = collect(engine.parallel("What is 17*23?", SamplingConfig(temperature=0.8, seed=4, max_tokens=16,
                                                                        ignore_eos=True), n=3, mode="base"))
    assert calls and set(calls) <= {1, 3}, "both ran through the fused step"
    fused_engine = engine.fused
    engine.fused = None
    try:
        assert engine.generate("What is 17*23?", cfg).text == fused_text
        again = collect(engine.parallel("What is 17*23?", SamplingConfig(temperature=0.8, seed=4, max_tokens=16,
                                                                          ignore_eos=True), n=3, mode="base"))
    finally:
        engine.fused = fused_engine
    assert [c.text for c in again.candidates] == [c.text for c in sampled.candidates]


def lora_engine() -> Engine:
    model = adapters.attach_new(quantize_model(make_model(448, hidden_size=256), 4, head_bits=4), rank=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.05)
    return Engine(model.eval(), make_tokenizer(), model_id="tiny", context=512, adapter_name="reason", kv="int8")


def test_adapter_steps_equal_peft_lora_layers_on_the_module_path():
    engine = lora_engine()
    assert engine.fused is not None, "the LoRA wrappers' base layers are packed int4"
    step = engine.fused.with_adapter(engine.slots.reasoning.peft_name)
    assert step is not None
    cache, _ = prefilled(engine.model, rows=2)
    other = copy.deepcopy(cache)
    tokens = torch.tensor([9, 200])
    with engine.slots.using(engine.slots.reasoning):
        for _ in range(12):
            fused = step.step(tokens, cache)
            with torch.inference_mode():
                ref = engine.model(input_ids=tokens.view(-1, 1), cache=other, use_cache=True,
                                   logits_to_keep=1).logits[:, -1]
            torch.testing.assert_close(fused, ref, atol=0, rtol=0)
            tokens = ref.float().argmax(-1)
    with engine.slots.using(None), torch.inference_mode():  # the adapter changes what the model computes
        base = engine.model(input_ids=tokens.view(-1, 1), cache=copy.deepcopy(other), use_cache=True,
                            logits_to_keep=1).logits[:, -1]
    assert not torch.equal(step.step(tokens, copy.deepcopy(cache)), base)


def test_steps_the_fused_path_does_not_compute_take_the_module_path(monkeypatch):
    engine = lora_engine()
    calls = []
    original = FusedDecoder.step

    def counted(self, tokens, cache, lora=None):
        calls.append(lora is not None)
        return original(self, tokens, cache, lora)

    monkeypatch.setattr(FusedDecoder, "step", counted)
    cfg = SamplingConfig(temperature=0, max_tokens=6, ignore_eos=True)
    engine.generate("hello", cfg, mode="reason", budget=4, answer_max_tokens=3)
    assert calls and all(calls[:3]), "thinking steps run the adapter through the fused step"
    calls.clear()
    engine.generate("hello", cfg, mode="base")
    assert calls == [False] * 5
    engine.kv = "bf16"
    engine.generate("hello", cfg, mode="base")
    assert len(calls) == 5, "a bf16 cache is transformers' own"
    engine.kv, engine.decode = "int8", "griffin"
    engine.generate("hello", cfg, mode="base")
    assert len(calls) == 5, "sparse feed-forward decoding is the modules' own"


def test_no_fused_decoder_for_weights_that_are_not_packed_int4():
    assert FusedDecoder.build(make_model(448, hidden_size=256)) is None
    assert FusedDecoder.build(quantize_model(make_model(448, hidden_size=256), 8, head_bits=8)) is None
    assert FusedDecoder.build(quantize_model(make_model(448), 4, head_bits=4)) is None, "128 inputs: int8 layers"
