"""Choosing adapters without reloading the model, on the tiny model: skill adapters answer Fast requests on the
base model's prompt cache, reasoning adapters switch in place, a zero LoRA is exactly the base model, and
load_engine takes the reasoning adapter from the library."""
from pathlib import Path

import pytest
import torch

from core.adapters import lora as adapters
from core.adapters import slots as adapter_slots
from core.adapters.cards import AdapterCard
from core.adapters.library import AdapterLibrary
from core.config import EngineConfig, SamplingConfig
from core.engine import Engine, collect
from core.loading import load_engine
from tests.conftest import TINY_ID
from tests.tiny import make_model, make_reasoning_engine, make_tokenizer

GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=12, ignore_eos=True)


def save_random_adapter(folder: Path, seed: int, zero: bool = False) -> Path:
    """A rank-4 adapter of the tiny architecture; `zero` keeps peft's initialisation (B = 0: no change)."""
    model = adapters.attach_new(make_model(448), rank=4)
    if not zero:
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    torch.nn.init.normal_(p, std=0.3)
    adapters.save_adapter(model, folder, {})
    return folder


def card(folder: Path, name: str, kind: str = "skill", base_model: str = "tiny", fingerprint=None) -> AdapterCard:
    return AdapterCard(name, kind, base_model, fingerprint, None, {}, {}, "2026-11-30T00:00:00", folder, False)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {"skill": save_random_adapter(root / "skill", 1), "zero": save_random_adapter(root / "zero", 2, zero=True),
            "reason-b": save_random_adapter(root / "reason-b", 3), "other": save_random_adapter(root / "other", 4)}


def plain_engine() -> Engine:
    return Engine(make_model(448), make_tokenizer(), model_id="tiny", context=512)


class Recorder:
    """Every next-token logits row the LM head computes, and the cache after the request."""

    def __init__(self, engine: Engine):
        self.logits = []
        head = engine.model.get_output_embeddings()
        self.handle = head.register_forward_hook(lambda m, a, out: self.logits.append(out[:, -1].float().clone()))

    def close(self):
        self.handle.remove()


def answer_with(engine: Engine, **kw):
    rec = Recorder(engine)
    try:
        answer = collect(engine.stream("Tell me about cats.", GREEDY, **kw))
    finally:
        rec.close()
    keys = [layer.keys.clone() for layer in engine.last_cache.layers]
    return answer, rec.logits, keys


def test_a_skill_adapter_answers_on_the_base_prompt_cache(folders):
    engine = plain_engine()
    base, base_logits, base_keys = answer_with(engine)
    assert not adapters.is_adapted(engine.model) and engine.adapter_names() == {"reasoning": None, "skills": []}
    assert engine.load_skill(card(folders["skill"], "sql")) == "sql"  # wraps the model in peft on first load
    assert adapters.is_adapted(engine.model) and not engine.can_reason
    skilled, skill_logits, skill_keys = answer_with(engine, skill="sql")
    again, again_logits, _ = answer_with(engine)
    assert skilled.adapter == "sql" and base.adapter is None and again.adapter is None
    n = base.stats.prompt_tokens
    assert skilled.stats.prompt_tokens == n
    for b, s in zip(base_keys, skill_keys, strict=True):  # the prompt is encoded by the base model
        assert torch.equal(b[:, :, :n], s[:, :, :n])
    assert torch.equal(base_logits[0], skill_logits[0])  # the first answer token comes from the base prefill
    assert not torch.equal(base_logits[1], skill_logits[1])  # after that the skill adapter answers
    assert skilled.token_ids != base.token_ids
    assert again.token_ids == base.token_ids and torch.equal(torch.stack(again_logits), torch.stack(base_logits))
    assert engine.adapter_names() == {"reasoning": None, "skills": ["sql"]}
    alone = engine.generate_batch(["Tell me about cats."], GREEDY, skill="sql")
    assert alone[0].adapter == "sql" and alone[0].token_ids == skilled.token_ids  # one row: the same steps
    # With rows beside it, torch's bf16 matrix products can round a row differently where the CPU lacks
    # AVX512-BF16 (an Intel Xeon here: the 4th token of 12 flipped on this random tiny model), so a batch row is
    # held to the skill's own first tokens, which the base model does not choose.
    batch = engine.generate_batch(["Tell me about cats.", "Hi"], GREEDY, skill="sql")
    assert [a.adapter for a in batch] == ["sql", "sql"]
    assert batch[0].token_ids[:3] == skilled.token_ids[:3] and skilled.token_ids[:3] != base.token_ids[:3]
    par = collect(engine.parallel("Tell me about cats.", GREEDY, n=2, mode="base", skill="sql"))
    assert par.adapter == "sql" and len({c.text for c in par.candidates}) == 1  # two greedy rows of one prompt
    assert par.candidates[0].text.startswith(engine.tokenizer.decode(list(skilled.token_ids[:3])))


def test_a_zero_lora_gives_exactly_the_base_output(folders):
    engine = plain_engine()
    base, base_logits, _ = answer_with(engine)
    engine.load_skill(card(folders["zero"], "zero"))
    zero, zero_logits, _ = answer_with(engine, skill="zero")
    assert zero.token_ids == base.token_ids and zero.text == base.text
    assert torch.equal(torch.stack(zero_logits), torch.stack(base_logits))


def test_switching_the_reasoning_adapter_needs_no_reload(folders):
    engine = make_reasoning_engine()
    model, base_model = engine.model, engine.model.get_base_model()
    weights = base_model.lm_head.weight
    first = collect(engine.stream("Why?", GREEDY, mode="reason", budget=6, answer_max_tokens=4, trace_key="t"))
    assert first.adapter == "reason" and engine.has_trace("t")
    engine.use_reasoning_adapter(card(folders["reason-b"], "b", kind="reasoning"))
    assert engine.model is model and engine.model.get_base_model() is base_model
    assert base_model.lm_head.weight is weights and engine.adapter_names()["reasoning"] == "b"
    assert not engine.has_trace("t")  # a trace thought by another adapter is not continued
    second = collect(engine.stream("Why?", GREEDY, mode="reason", budget=6, answer_max_tokens=4))
    assert second.adapter == "b" and second.thinking_tokens == 6 and second.token_ids != first.token_ids
    engine.load_skill(card(folders["skill"], "sql"))  # a skill does not disturb the reasoning adapter
    collect(engine.stream("Why?", GREEDY, skill="sql"))
    assert collect(engine.stream("Why?", GREEDY, mode="reason", budget=6, answer_max_tokens=4)).token_ids == \
        second.token_ids
    engine.use_reasoning_adapter(None)
    assert not engine.can_reason and engine.adapter_names() == {"reasoning": None, "skills": ["sql"]}
    with pytest.raises(ValueError, match="reasoning adapter"):
        collect(engine.stream("Why?", GREEDY, mode="reason"))
    engine.use_reasoning_adapter(card(folders["reason-b"], "b", kind="reasoning"))  # loaded once, switched back
    assert collect(engine.stream("Why?", GREEDY, mode="reason", budget=6, answer_max_tokens=4)).token_ids == \
        second.token_ids
    assert len(engine.model.peft_config) == 3 and engine.model is model


def test_adapters_that_do_not_fit_are_refused_and_change_nothing(folders, tmp_path):
    engine = plain_engine()
    with pytest.raises(ValueError, match="is a reasoning adapter, not a skill adapter"):
        engine.load_skill(card(folders["skill"], "x", kind="reasoning"))
    with pytest.raises(ValueError, match="trained for qwen2.5-7b-instruct, not tiny"):
        engine.load_skill(card(folders["skill"], "x", base_model="qwen2.5-7b-instruct"))
    engine.base_fingerprint = "a" * 16
    with pytest.raises(ValueError, match="other base weights"):
        engine.use_reasoning_adapter(card(folders["reason-b"], "x", kind="reasoning", fingerprint="b" * 16))
    with pytest.raises(ValueError, match="'nope' is not loaded"):
        collect(engine.stream("hi", GREEDY, skill="nope"))
    wide = tmp_path / "wide"  # another architecture: peft cannot load it into this model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    adapters.save_adapter(adapters.attach_new(Qwen2ForCausalLM(config), rank=4), wide, {})
    base = collect(engine.stream("hi", GREEDY))
    with pytest.raises(ValueError, match="does not fit"):  # the first adapter: peft wraps the model, then unwraps
        engine.load_skill(card(wide, "wide"))
    assert not adapters.is_adapted(engine.model) and not any("lora" in n for n, _ in engine.model.named_modules())
    assert collect(engine.stream("hi", GREEDY)).token_ids == base.token_ids
    engine.load_skill(card(folders["skill"], "sql"))
    with pytest.raises(ValueError, match="does not fit"):  # beside another adapter
        engine.load_skill(card(wide, "wide"))
    assert len(engine.model.peft_config) == 1 and engine.adapter_names()["skills"] == ["sql"]
    assert collect(engine.stream("hi", GREEDY, skill="sql")).adapter == "sql"


def test_least_recently_used_skills_are_dropped_never_the_reasoning_adapter(folders, tmp_path, monkeypatch):
    monkeypatch.setattr(adapter_slots, "MAX_LOADED", 2)
    engine = make_reasoning_engine()
    engine.load_skill(card(folders["skill"], "one"))
    engine.load_skill(card(folders["other"], "two"))
    assert engine.adapter_names() == {"reasoning": "reason", "skills": ["two"]}
    assert sorted(engine.model.peft_config) == ["ponder2", "reason"]
    assert collect(engine.stream("Why?", GREEDY, mode="reason", budget=4, answer_max_tokens=2)).adapter == "reason"


def test_load_engine_takes_the_reasoning_adapter_from_the_library(tiny_store, folders, tmp_path):
    library = AdapterLibrary(store=tiny_store)
    library.add_from_folder(folders["reason-b"], TINY_ID, "concise", kind="reasoning")
    cfg = EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16", reasoning_adapter="concise")
    engine = load_engine(cfg, tiny_store)
    assert engine.adapter_name == "concise" and engine.warnings == [] and engine.base_fingerprint
    assert collect(engine.stream("Why?", GREEDY, mode="reason", budget=3, answer_max_tokens=2)).adapter == "concise"
    missing = load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16", reasoning_adapter="gone"),
                          tiny_store)
    assert not missing.can_reason and len(missing.warnings) == 1
    assert "'gone'" in missing.warnings[0] and missing.warnings[0].endswith("using no reasoning adapter.")


def test_adapter_weights_are_copied_as_peft_loads_them_without_the_base_state_dict(folders, tmp_path):
    """`copy_adapter_weights` (used because peft's loader unpacks every quantized base weight through
    `state_dict()`) fills the LoRA parameters exactly as peft's own loader does, and refuses a file that does
    not fit."""
    from peft import PeftModel

    ids = torch.tensor([[1, 5, 9, 42, 7]])
    by_peft = PeftModel.from_pretrained(make_model(448), str(folders["skill"]), adapter_name="a").eval()
    ours = adapter_slots._wrap(make_model(448), folders["skill"], "a").eval()
    with torch.no_grad():
        assert torch.equal(by_peft(ids).logits, ours(ids).logits)
    wide = adapters.attach_new(make_model(448), rank=8)  # rank 8 parameters, rank 4 file
    with pytest.raises(ValueError, match="shape"):
        adapters.copy_adapter_weights(wide, folders["skill"], adapters.ADAPTER_NAME)


def test_a_loaded_engine_leaves_the_collectors_full_passes(tiny_store):
    """load_engine freezes what it loaded (gc.freeze): a full collection no longer walks the model's objects,
    which stalled the window for ~0.2 s per collection with the 0.5B loaded."""
    import gc

    engine = load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16"))
    try:
        assert gc.get_freeze_count() > 0
        assert not gc.is_tracked(engine.model) or not any(o is engine.model for o in gc.get_objects())
    finally:
        gc.unfreeze()
