"""The components shipped in resources/ fit the models they are shipped for, and say how they were made.

Read from the files alone (no model load): every model folder names a known model, the reasoning adapter's
LoRA tensors have that model's shapes, the heads read that model's hidden size, and each records the command
that made it, so a component copied into the wrong folder or trained on another model fails here.
"""
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from core.storage.paths import resource_dir
from models.registry import KNOWN_MODELS

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = resource_dir() / "components"
MODEL_DIRS = sorted(p for p in COMPONENTS.iterdir() if p.is_dir())
ADAPTERS = [p for p in MODEL_DIRS if (p / "reasoning").is_dir()]
HEADS = [(p, kind) for p in MODEL_DIRS for kind in ("switcher", "verifier") if (p / kind).is_dir()]


def test_every_component_folder_is_a_known_model_with_the_full_stack():
    assert MODEL_DIRS, "no shipped components"
    assert {p.name for p in MODEL_DIRS} <= set(KNOWN_MODELS)
    assert set(ADAPTERS) == set(MODEL_DIRS)
    for kind in ("switcher", "verifier"):
        assert {p for p, k in HEADS if k == kind} == set(MODEL_DIRS), f"a model without its {kind}"


@pytest.mark.parametrize("model_dir", ADAPTERS, ids=lambda p: p.name)
def test_reasoning_adapter_matches_its_model(model_dir):
    folder = model_dir / "reasoning"
    spec = KNOWN_MODELS[model_dir.name]
    meta = json.loads((folder / "ponder_adapter.json").read_text())
    config = json.loads((folder / "adapter_config.json").read_text())
    assert meta["kind"] == "reasoning" and meta["base_model"] == model_dir.name
    assert meta["command"].startswith("ponder train sft") and meta["traces_from"]
    # made on, or measured on, the weights the app serves the model on: no "trained on other weights" note
    assert meta["base_precision"] == spec.precision or spec.precision in meta.get("validated_on", {})
    rank = config["r"]
    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
        layers = {int(n.split(".layers.")[1].split(".")[0]) for n in names}
        assert layers == set(range(spec.num_layers))
        q_a = next(n for n in names if "q_proj.lora_A" in n)
        assert tuple(f.get_slice(q_a).get_shape()) == (rank, spec.hidden_size)
        k_b = next(n for n in names if "k_proj.lora_B" in n)
        assert tuple(f.get_slice(k_b).get_shape()) == (spec.num_kv_heads * spec.head_dim, rank)
    traces = folder / "train_traces.jsonl"
    if not traces.is_file():  # drawn from committed campaign files by the command in traces_from
        named = [w for w in meta["traces_from"].split() if w.startswith("bench/results/distill/")]
        assert named and all((ROOT / w.rstrip(",")).is_file() for w in named)
        return
    for line in traces.read_text().splitlines():
        row = json.loads(line)
        assert row["question"] and row["thinking"] and row["answer"]  # distill rows also carry provenance
        assert row.get("provenance", {"right": 1})["right"]


@pytest.mark.parametrize(("model_dir", "kind"), HEADS, ids=lambda v: getattr(v, "name", v))
def test_heads_read_their_models_hidden_states(model_dir, kind):
    folder = model_dir / kind
    head = json.loads((folder / "head.json").read_text())
    assert head["kind"] == kind and head["model"] == model_dir.name
    assert head["hidden_size"] == KNOWN_MODELS[model_dir.name].hidden_size
    assert head["trained_on"]["command"].startswith(f"ponder train {kind}")
    assert head["precision"] == KNOWN_MODELS[model_dir.name].precision  # fitted on the weights the app serves
    if kind == "verifier":  # the ranking a weighted vote needs, measured out of fold, is part of what ships
        oof = head["within_question_auc_oof"]
        # it ranks a question's right answers above its wrong ones better than a coin (0.5; a head trained on
        # labels that do not match its features measures about that, one with its sign flipped 1 - auc), over
        # enough questions for the mean to say so (shipped: 0.697 over 434 questions for the 0.5B, 0.677 over 321 for the 1.5B)
        assert oof["auc"] > 0.55 and oof["questions_with_both"] >= 20
        cv = head["cv_auc"]  # measured at the weight decay that ships: the one cross-validation picked
        assert float(max(cv, key=cv.get)) == head["weight_decay"]
        assert f"weight decay {head['weight_decay']}," in oof["note"]
        assert head.get("calibration", {"scale": 1.0})["scale"] > 0  # a negative scale would rank backwards
        if "vote_oof" in head:  # `ponder train verifier` chose the rule by out-of-fold votes: the best one ships
            votes = head["vote_oof"]
            assert head["vote"] == ("weighted" if max(votes["head"], votes["combiner"]) > votes["majority"]
                                    else "majority")
            assert ("combiner" in head) == (votes["combiner"] > votes["head"])
        elif "vote" in head:  # a rule other than the weighted vote is a measured choice, and says where it was made
            assert head["vote"] in ("weighted", "majority") and head["vote_rule"]["chosen_by"].startswith(
                "python -m bench.vote_rules")
