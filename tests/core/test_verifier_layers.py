"""bench.verifier_layers: each recorded layer gets the same out-of-fold head and votes, so the layer that knows wins."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from bench import verifier_layers


def _layered_cache(tmp_path, questions: int = 24, samples: int = 8) -> Path:
    """Each question has 2, 3, 5 or 6 right answers ("2") of 8, the rest wrong ("1"), so majority is right on half
    the questions and no rule on group sizes or order alone does better. Layer 7 holds a right/wrong direction plus noise;
    layer 3 and the final state are noise."""
    gen = torch.Generator().manual_seed(0)
    direction = torch.randn(16, generator=gen)
    knows, ys, groups, extras, rows = [], [], [], [], []
    for q in range(questions):
        right_count = (2, 3, 5, 6)[q % 4]
        first_right = q % 8 < 4  # which answer comes first: a tie between groups goes to it
        for s in range(samples):
            right = s < right_count if first_right else s >= samples - right_count
            knows.append(torch.randn(16, generator=gen) * 0.3 + (direction if right else -direction))
            ys.append(float(right))
            groups.append(q)
            share = (right_count if right else samples - right_count) / samples
            extras.append([-0.1, -0.5, share])
            rows.append({"question_index": q, "final_answer": "2" if right else "1", "correct": right,
                         "logprob_mean": -0.1, "logprob_lowest": -0.5})
    knows = torch.stack(knows)
    path = tmp_path / "features.safetensors"
    save_file({"x": torch.randn(knows.shape, generator=gen), "y": torch.tensor(ys), "groups": torch.tensor(groups),
               "extras": torch.tensor(extras), "done": torch.tensor([questions]), "seconds": torch.tensor([1.0]),
               "layers": torch.stack([torch.randn(knows.shape, generator=gen), knows], 1)},
              str(path), metadata={"layers": "[3, 7]"})
    path.with_name(path.name + ".candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_layer_that_knows_the_answer_ranks_and_votes_best(tmp_path):
    path = _layered_cache(tmp_path)
    out = tmp_path / "layers"
    verifier_layers.main([str(path), "--out", str(out), "--seed", "1", "--weight-decay", "0.1"])
    r = json.loads(Path(f"{out}.json").read_text())
    sets = r["sets"]
    assert list(sets) == ["layer 3", "layer 7", "final (the shipped head's)", "all of them"]
    assert r["layers"] == [3, 7] and r["questions"] == 24 and sets["all of them"]["dims"] == 3 * 16
    assert sets["layer 7"]["majority"] == 50.0
    assert sets["layer 7"]["auc"] > 0.9 and max(sets["layer 7"]["head"].values()) >= 90.0
    assert max(sets["layer 7"]["combiner-no-share"].values()) >= 90.0
    for noise in ("layer 3", "final (the shipped head's)"):
        assert sets[noise]["auc"] < 0.75 and max(sets[noise]["head"].values()) < 75.0
    assert "| layer 7 | 16 | 0.1 |" in Path(f"{out}.md").read_text()


def test_a_cache_without_layers_or_with_too_few_is_refused(tmp_path):
    path = _layered_cache(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(str(path))
    save_file({k: v for k, v in saved.items() if k != "layers"}, str(path))
    with pytest.raises(SystemExit, match="holds no other layers"):
        verifier_layers.main([str(path), "--out", str(tmp_path / "x")])
    save_file(saved, str(path), metadata={"layers": "[3, 7, 9]"})
    with pytest.raises(SystemExit, match="names layers"):
        verifier_layers.main([str(path), "--out", str(tmp_path / "x")])
