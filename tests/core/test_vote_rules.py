"""bench.vote_rules: every rule votes on the same saved samples, learned scores out of fold."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from bench import vote_rules


def _cache(tmp_path, questions: int = 20, samples: int = 8, seed: int = 0):
    """Each question: 5 wrong answers ("1") outvote 3 right ones ("2"); the hidden state says which is which (a
    direction plus noise), the log-probs favour nothing. Majority is always wrong; a head on x is not. Another
    `seed` draws other samples of the same kind (the same direction)."""
    gen = torch.Generator().manual_seed(0)
    direction = torch.randn(16, generator=gen)
    if seed:
        gen.manual_seed(seed)
    xs, ys, groups, extras, rows = [], [], [], [], []
    for q in range(questions):
        for s in range(samples):
            right = s % 8 in (1, 4, 6)
            xs.append(torch.randn(16, generator=gen) * 0.3 + (direction if right else -direction))
            ys.append(float(right))
            groups.append(q)
            mean, lowest = -0.1 - 0.01 * s, -0.5 - 0.01 * s
            share = 3 / 8 if right else 5 / 8
            extras.append([mean, lowest, share])
            rows.append({"question_index": q, "final_answer": "2" if right else "1", "correct": right,
                         "logprob_mean": mean, "logprob_lowest": lowest})
    path = tmp_path / "features.safetensors"
    save_file({"x": torch.stack(xs), "y": torch.tensor(ys), "groups": torch.tensor(groups),
               "extras": torch.tensor(extras), "done": torch.tensor([questions]), "seconds": torch.tensor([1.0])},
              str(path))
    path.with_name(path.name + ".candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def test_head_out_of_fold_beats_majority_where_the_hidden_state_knows(tmp_path):
    path, _ = _cache(tmp_path)
    out = tmp_path / "rules"
    vote_rules.main([str(path), "--out", str(out), "--weight-decay", "0.1", "--seed", "1"])
    result = json.loads(out.with_suffix(".json").read_text())
    rules = result["rules"]
    assert result["questions"] == 20 and result["pass"] == 100.0
    assert rules["majority"]["accuracy"] == 0.0 and rules["confidence"]["accuracy"] == 0.0
    assert rules["head"]["accuracy"] >= 90.0 and rules["head"]["wins_vs_majority"] >= 18
    assert rules["best"]["accuracy"] >= 90.0
    assert result["within_question_auc"]["head"] > 0.9
    assert "| head |" in out.with_suffix(".md").read_text()


def test_a_shipped_verifier_is_scored_as_the_app_votes_with_it(tmp_path):
    """--shipped: a head saved by `train_verifier` on other samples votes these as the app would: weighted by its
    calibrated probability (or its combiner's); a head saved with `"vote": "majority"` has no row of its own."""
    from core.reasoning.verifier import Verifier
    from core.training.heads import train_verifier

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    train, train_rows = _cache(tmp_path / "a", questions=30)
    data, _ = vote_rules.load(train)
    train_verifier(data["x"], data["y"], data["groups"], tmp_path / "v", hidden_size=16, model_id="t", precision="bf16",
                   extras=data["extras"], answers=[r["final_answer"] for r in train_rows])
    assert json.loads((tmp_path / "v" / "head.json").read_text())["vote"] == "weighted"
    path, _ = _cache(tmp_path / "b", seed=1)  # the same kind of samples, others drawn
    held, _ = vote_rules.load(path)
    scores = vote_rules.shipped_scores(held, tmp_path / "v")
    torch.testing.assert_close(scores["shipped-head"], torch.tensor(Verifier.load(tmp_path / "v").scores(held["x"]),
                                                                    dtype=torch.float64))
    out = tmp_path / "rules"
    vote_rules.main([str(path), "--out", str(out), "--weight-decay", "0.1", "--shipped", str(tmp_path / "v")])
    rules = json.loads(out.with_suffix(".json").read_text())["rules"]
    assert rules["majority"]["accuracy"] == 0.0 and rules["shipped-head"]["accuracy"] >= 90.0 and "shipped" in rules
    config = json.loads((tmp_path / "v" / "head.json").read_text())
    (tmp_path / "v" / "head.json").write_text(json.dumps({**config, "vote": "majority"}))
    assert set(vote_rules.shipped_scores(held, tmp_path / "v")) == {"shipped-head"}


def test_a_candidates_file_of_other_samples_is_refused(tmp_path):
    path, rows = _cache(tmp_path, questions=3)
    rows[5]["correct"] = not rows[5]["correct"]
    path.with_name(path.name + ".candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit, match="do not describe the same samples"):
        vote_rules.main([str(path), "--out", str(tmp_path / "r"), "--weight-decay", "1"])


def _ranked_cache(tmp_path, signal: bool, questions: int = 35):
    """Question q has 1 + q % 7 right samples of 8 (answer "2", every other one written "2.00") and the rest
    wrong ("1"), so majority is right where 5 to 7 are, or 4 (a tie, to the earliest sample, a right one): 4 of 7
    questions. Log-probs are noise; the hidden state says which is right when `signal`, else it is noise too."""
    gen = torch.Generator().manual_seed(1)
    direction = torch.randn(16, generator=gen)
    xs, ys, groups, extras, rows = [], [], [], [], []
    for q in range(questions):
        right_count = 1 + q % 7
        for s in range(8):
            right = s < right_count
            noise = torch.randn(16, generator=gen) * 0.3
            xs.append(noise + (direction if right else -direction) * float(signal))
            ys.append(float(right))
            groups.append(q)
            mean, lowest = -0.3 + 0.1 * float(torch.randn(1, generator=gen)), -1 + 0.2 * float(torch.randn(1, generator=gen))
            extras.append([mean, lowest, (right_count if right else 8 - right_count) / 8])
            rows.append({"question_index": q, "final_answer": ("2" if s % 2 else "2.00") if right else "1",
                         "correct": right, "logprob_mean": mean, "logprob_lowest": lowest})
    path = tmp_path / "ranked.safetensors"
    save_file({"x": torch.stack(xs), "y": torch.tensor(ys), "groups": torch.tensor(groups),
               "extras": torch.tensor(extras), "done": torch.tensor([questions]), "seconds": torch.tensor([1.0])},
              str(path))
    path.with_name(path.name + ".candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("signal", [True, False])
def test_the_answer_ranker_follows_the_hidden_state_only_where_it_knows(tmp_path, signal):
    path = _ranked_cache(tmp_path, signal)
    out = tmp_path / "rules"
    vote_rules.main([str(path), "--out", str(out), "--weight-decay", "0.1", "--seed", "1"])
    rules = json.loads(out.with_suffix(".json").read_text())["rules"]
    assert rules["majority"]["accuracy"] == 57.1  # 20 of 35: "2" and "2.00" vote together
    if signal:
        assert rules["answers"]["accuracy"] >= 90.0
    else:  # the vote share and noise to go on: about majority's 20, not the hidden state's 35
        assert abs(rules["answers"]["right"] - rules["majority"]["right"]) <= 4


def test_answers_are_grouped_as_the_vote_groups_them():
    rows = [{"question_index": 0, "final_answer": a} for a in ("48", "48.00", None, "50")] + \
           [{"question_index": 1, "final_answer": "48"}]
    assert vote_rules.answer_groups(rows) == [(0, [0, 1]), (0, [3]), (1, [4])]
