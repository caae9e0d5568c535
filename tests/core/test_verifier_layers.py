"""bench.verifier_layers: each recorded layer gets the same out-of-fold head and vote, so the layer that knows wins."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bench import verifier_layers
from tests.core.test_vote_rules import _cache


def test_the_layer_that_knows_the_answer_ranks_and_votes_best(tmp_path):
    """Majority is always wrong in these samples (5 wrong outvote 3 right). Layer 7 holds the right/wrong direction
    the vote_rules fixture put in x; layer 3 and the final state are noise."""
    path, _ = _cache(tmp_path)
    saved = load_file(str(path))
    gen = torch.Generator().manual_seed(1)
    knows, noise = saved["x"], torch.randn(saved["x"].shape, generator=gen)
    deep = torch.stack([torch.randn(knows.shape, generator=gen), knows], 1)
    save_file({**saved, "x": noise, "layers": deep}, str(path), metadata={"layers": "[3, 7]"})
    out = tmp_path / "layers"
    verifier_layers.main([str(path), "--out", str(out), "--seed", "1", "--weight-decay", "0.1"])
    r = json.loads(out.with_suffix(".json").read_text())
    sets = r["sets"]
    assert list(sets) == ["layer 3", "layer 7", "final (the shipped head's)", "all of them"]
    assert r["layers"] == [3, 7] and r["questions"] == 20 and sets["all of them"]["dims"] == 3 * 16
    assert sets["layer 7"]["auc"] > 0.9 and sets["layer 3"]["auc"] < 0.75 and sets["final (the shipped head's)"]["auc"] < 0.75
    assert sets["layer 7"]["majority"] == 0.0 and max(sets["layer 7"]["exp"], sets["layer 7"]["llr"]) >= 90.0
    assert "| layer 7 | 16 |" in out.with_suffix(".md").read_text()


def test_a_cache_without_layers_is_refused(tmp_path):
    path, _ = _cache(tmp_path)
    with pytest.raises(SystemExit, match="holds no other layers"):
        verifier_layers.main([str(path), "--out", str(tmp_path / "x")])
