"""bench.vote_rules: every rule votes on the same saved samples, learned scores out of fold."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from bench import vote_rules


def _cache(tmp_path, questions: int = 20, samples: int = 8):
    """Each question: 5 wrong answers ("1") outvote 3 right ones ("2"); the hidden state says which is which (a
    direction plus noise), the log-probs favour nothing. Majority is always wrong; a head on x is not."""
    gen = torch.Generator().manual_seed(0)
    direction = torch.randn(16, generator=gen)
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
    assert rules["answers"]["accuracy"] >= 90.0  # the answer ranker learns that the head, not the count, decides
    assert result["within_question_auc"]["head"] > 0.9
    assert "| head |" in out.with_suffix(".md").read_text()


def test_a_candidates_file_of_other_samples_is_refused(tmp_path):
    path, rows = _cache(tmp_path, questions=3)
    rows[5]["correct"] = not rows[5]["correct"]
    path.with_name(path.name + ".candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit, match="do not describe the same samples"):
        vote_rules.main([str(path), "--out", str(tmp_path / "r"), "--weight-decay", "1"])
