"""Preferences: validated, stored in the chat store, and tolerant of bad stored values."""
import pytest

from app.settings import BUDGET_CHOICES, REASONING_MEASURED, AppSettings, budget_note, from_dict, load_settings, save_settings
from core.storage.chats import ChatStore
from models.registry import KNOWN_MODELS


def test_saved_settings_come_back(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    s = AppSettings(mode="base", budget=None, parallel=4, threads=2, theme="dark", top_k=0)
    save_settings(store, s)
    assert load_settings(ChatStore(tmp_path / "chats.db")) == s


def test_bad_stored_values_fall_back_to_defaults_one_by_one():
    s = from_dict({"mode": "telepathy", "budget": 300, "parallel": 99, "temperature": "hot", "theme": "dark",
                   "unknown": 1, "top_p": 0.5})
    d = AppSettings()
    assert (s.mode, s.budget, s.parallel, s.temperature) == (d.mode, d.budget, d.parallel, d.temperature)
    assert s.theme == "dark" and s.top_p == 0.5
    assert from_dict(None) == d and from_dict(["not", "a", "dict"]) == d
    assert from_dict({"decode": "sparse-ish"}).decode == "dense" and from_dict({"decode": "griffin"}).decode == "griffin"


def test_invalid_settings_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="parallel"):
        AppSettings(parallel=9)
    with pytest.raises(ValueError, match="top_p"):
        AppSettings(top_p=0)


def test_sampling_depends_on_parallel_answers():
    s = AppSettings(temperature=0.1, parallel_temperature=0.8, answer_max_tokens=100)
    assert s.sampling(1).temperature == 0.1 and s.sampling(4).temperature == 0.8
    assert s.sampling(1).max_tokens == 100


def test_reasoning_adapters_per_model_are_validated_and_bad_entries_dropped(tmp_path):
    from app.settings import with_reasoning_adapter

    s = from_dict({"reasoning_adapters": {"qwen2.5-0.5b": "math-v2", "Bad Id": "x", "tiny": "../escape",
                                          "tiny-qwen2": 7, "other": "concise"}, "theme": "dark"})
    assert s.reasoning_adapters == {"qwen2.5-0.5b": "math-v2", "other": "concise"} and s.theme == "dark"
    assert from_dict({"reasoning_adapters": ["not", "a", "dict"]}).reasoning_adapters == {}
    with pytest.raises(ValueError, match="not a valid"):
        AppSettings(reasoning_adapters={"tiny": "no/slashes"})
    s = with_reasoning_adapter(s, "tiny-qwen2", "short")
    assert s.reasoning_adapters["tiny-qwen2"] == "short"
    s = with_reasoning_adapter(s, "other", None)
    assert s.reasoning_adapters == {"qwen2.5-0.5b": "math-v2", "tiny-qwen2": "short"}
    store = ChatStore(tmp_path / "chats.db")
    save_settings(store, s)
    assert load_settings(ChatStore(tmp_path / "chats.db")).reasoning_adapters == s.reasoning_adapters


def test_budget_notes_name_known_models_and_offered_budgets():
    for model_id, measured in REASONING_MEASURED.items():
        assert model_id in KNOWN_MODELS and measured
        for budget, (accuracy, cut, n) in measured.items():
            assert budget in BUDGET_CHOICES and 0 <= accuracy <= 1 and 0 <= cut <= 1 and n >= 300
            assert f"{budget} → {accuracy:.1%} ({cut:.0%} cut)" in budget_note(model_id)
    assert budget_note("tiny") == ""


def test_a_new_message_starts_at_the_models_own_budget_unless_one_is_preferred():
    from app.settings import composer_budget

    fresh = AppSettings()
    assert fresh.budget == 0
    assert composer_budget(fresh, "qwen2.5-coder-1.5b-instruct") == 512  # chosen on dev
    assert composer_budget(fresh, "qwen2.5-coder-0.5b-instruct") == 512  # chosen on dev too
    assert composer_budget(fresh, "an-imported-model") == 256
    assert composer_budget(AppSettings(budget=128), "qwen2.5-coder-1.5b-instruct") == 128
    assert composer_budget(AppSettings(budget=None), "qwen2.5-coder-1.5b-instruct") is None
    for spec in KNOWN_MODELS.values():
        assert spec.budget in BUDGET_CHOICES  # the composer offers it
