"""A damaged or mismatched reasoning adapter never stops the model from loading: it is skipped with a warning."""
import pytest

from core.adapters import lora as adapters
from core.config import EngineConfig
from core.loading import load_engine
from tests.conftest import TINY_ID
from tests.tiny import make_model


@pytest.fixture
def adapter_dir(tiny_store, tmp_path):
    folder = tiny_store.get(TINY_ID).folder / "components" / "reasoning"
    model = adapters.attach_new(make_model(448), rank=4)
    adapters.save_adapter(model, folder, {"name": "mine"})
    return folder


def test_a_good_user_adapter_loads(tiny_store, adapter_dir):
    engine = load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16"), tiny_store)
    assert engine.can_reason and engine.adapter_name == "mine" and engine.warnings == []


@pytest.mark.parametrize("damage", ["weights", "config", "meta"])
def test_a_damaged_adapter_is_skipped_with_a_warning(tiny_store, adapter_dir, damage):
    target = {"weights": "adapter_model.safetensors", "config": "adapter_config.json",
              "meta": adapters.META_FILE}[damage]
    (adapter_dir / target).write_bytes(b"\x00garbage{")
    engine = load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16"), tiny_store)
    assert not engine.can_reason
    assert len(engine.warnings) == 1 and engine.warnings[0].startswith("The reasoning adapter in ")
    assert "could not be loaded" in engine.warnings[0] and engine.warnings[0].endswith("using no reasoning adapter.")
    assert engine.generate("hi").text is not None  # the base model still answers


def test_an_adapter_for_other_weights_is_skipped(tiny_store, adapter_dir):
    meta = adapters.adapter_meta(adapter_dir)
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), adapter_dir,
                          {**meta, "base_fingerprint": "0" * 16})
    engine = load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16"), tiny_store)
    assert not engine.can_reason and "other base weights" in engine.warnings[0]


def test_components_trained_on_other_weights_load_with_a_note(tiny_store, adapter_dir):
    from models.heads import SwitcherHead, save_head

    meta = adapters.adapter_meta(adapter_dir)
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), adapter_dir, {**meta, "base_precision": "w4"})
    save_head(SwitcherHead(128), adapter_dir.parent / "switcher",
              {"kind": "switcher", "hidden_size": 128, "model": TINY_ID, "precision": "bf16"})
    engine = load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16"), tiny_store)
    assert engine.can_reason and engine.router is not None  # used, with one note: the head matches, the adapter not
    assert engine.warnings == ["The reasoning adapter was trained on W4 weights and this model runs on bf16: it may "
                               "work less well (retrain it on these weights, or run the model with --precision w4)."]


def test_an_adapter_measured_on_the_served_weights_loads_without_the_note(tiny_store, adapter_dir):
    """An adapter trained on W4 and measured since on the weights now served (`validated_on`) is kept quietly."""
    meta = adapters.adapter_meta(adapter_dir)
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), adapter_dir,
                          {**meta, "base_precision": "w4", "validated_on": {"bf16": "dev: as good as on W4"}})
    engine = load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16"), tiny_store)
    assert engine.can_reason and engine.warnings == []
    engine = load_engine(EngineConfig(model_id=TINY_ID, precision="w8", kv="bf16"), tiny_store)
    assert engine.can_reason and "trained on W4 weights and this model runs on W8" in engine.warnings[0]


def test_each_model_has_its_default_weights():
    from models.registry import DEFAULT_MODEL_ID

    assert EngineConfig().precision == "w4-fpt"  # the embedded model: its shipped adapter and heads are trained on it
    assert EngineConfig(model_id="qwen2.5-coder-1.5b-instruct").precision == "w4-fpt"
    assert EngineConfig(model_id=TINY_ID).precision == "w4"  # an import: W4, prepared in seconds
    assert EngineConfig(model_id=DEFAULT_MODEL_ID, precision="bf16").precision == "bf16"
