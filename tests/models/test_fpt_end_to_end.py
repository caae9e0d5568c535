"""The end-to-end stage of the trained transforms on the tiny model: it lowers the held-out KL of the quantized
model to the float one, the spec stays an exact rewrite of the float model, and an interrupted run resumes."""
import json

import pytest
import torch

from models.fpt import FptSpec, apply_fpt
from models.fpt_end_to_end import held_kl, train_end_to_end
from models.fpt_training import HELD_OUT, chunks
from tests.models.test_fpt import float_model, run
from tests.models.test_fpt_training import calibration_texts


def test_end_to_end_training_lowers_held_out_kl_and_keeps_the_float_function(tmp_path):
    model = float_model()
    ids = torch.randint(0, 448, (1, 30))
    before = run(model, ids).logits
    start = FptSpec.identity(model.config)
    state = tmp_path / "state"
    spec, log = train_end_to_end(float_model(), calibration_texts(), start, length=48, steps=8, batch=2, lr=1e-2,
                                 save_every=3, state=state)
    assert log["kept"] and log["held_kl_trained"] < log["held_kl_start"] and len(log["losses"]) == 8
    rows = chunks(calibration_texts(), 48, model.config.eos_token_id)
    held = rows[torch.arange(len(rows)) % HELD_OUT == HELD_OUT - 1]
    assert held_kl(float_model(), spec, held, 2) == pytest.approx(log["held_kl_trained"], rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(spec.mlp_scale, start.mlp_scale, strict=True))
    after = run(apply_fpt(model, spec), ids).logits  # still an exact rewrite of the float model
    torch.testing.assert_close(after, before, atol=2e-4, rtol=1e-4)

    # a run stopped after its sixth step (saved at 3 and 6) continues from the sixth on a rerun
    class Stop(Exception):
        pass

    def stop_at_7(row):
        if row["step"] == 7:
            raise Stop

    other = tmp_path / "other"
    with pytest.raises(Stop):
        train_end_to_end(float_model(), calibration_texts(), start, length=48, steps=8, batch=2, lr=1e-2,
                         save_every=3, state=other, report=stop_at_7)
    assert json.loads((other / "log.json").read_text())["steps_done"] == 6
    seen = []
    again, log2 = train_end_to_end(float_model(), calibration_texts(), start, length=48, steps=8, batch=2, lr=1e-2,
                                   save_every=3, state=other, report=seen.append)
    assert [r["step"] for r in seen] == [7, 8] and log2["losses"][:6] == log["losses"][:6]
    # step 7 resumes from the spec saved at step 6 on the same rows: the same loss as the uninterrupted run
    assert log2["losses"][6] == pytest.approx(log["losses"][6], rel=1e-4)
    assert json.loads((other / "log.json").read_text())["steps_done"] == 8
    with pytest.raises(ValueError, match="other settings"):
        train_end_to_end(float_model(), calibration_texts(), start, length=48, steps=5, state=other)
    with pytest.raises(ValueError, match="other settings"):  # the same settings on other texts
        train_end_to_end(float_model(), calibration_texts(), start, length=48, steps=8, batch=2, lr=1e-2,
                         save_every=3, state=other, texts="shipped + more")
    with pytest.raises(ValueError, match="other settings"):  # the same settings from another start
        train_end_to_end(float_model(), calibration_texts(), spec, length=48, steps=8, batch=2, lr=1e-2,
                         save_every=3, state=other)


def test_the_held_text_bound_is_refused_where_it_could_be_shipped(tmp_path, capsys):
    """`--on-held-text` trains on the evaluation text itself: a measurement, so it is an --end-to-end run that
    never writes into resources/ (where a spec would ship) and never mixes in other texts."""
    from core.storage.paths import resource_dir
    from scripts.fit_fpt_spec import main

    base = ["--model", "any", "--on-held-text", "--start", str(tmp_path)]
    for extra in (["--train", "--out", str(tmp_path)],  # not the layer-by-layer stage
                  ["--end-to-end", "--out", str(resource_dir() / "fpt" / "any")],  # never into resources/
                  ["--end-to-end", "--out", str(resource_dir())],  # nor resources/ itself
                  ["--end-to-end", "--out", str(tmp_path), "--extra-texts", "4"]):  # the held text alone
        with pytest.raises(SystemExit) as stop:
            main(base + extra)
        assert stop.value.code == 2
    assert "--on-held-text" in capsys.readouterr().err


def test_weighted_rows_score_only_their_positions_and_float_values_are_a_setting(tmp_path):
    """Rows given with per-position weights (the held-text bound's) train and score on those positions only;
    weights of one everywhere but the first position score as the plain rows do; kv8=False is part of the settings."""
    model = float_model()
    rows = chunks(calibration_texts(), 48, model.config.eos_token_id)
    start = FptSpec.identity(model.config)
    ones = torch.ones(rows.shape)
    ones[:, 0] = 0
    assert held_kl(model, start, rows, 2, ones) == pytest.approx(held_kl(model, start, rows, 2), rel=1e-5)
    half = ones.clone()
    half[:, : rows.shape[1] // 2] = 0  # only the second half of each row is scored
    assert held_kl(model, start, rows, 2, half) != pytest.approx(held_kl(model, start, rows, 2), rel=1e-3)
    assert held_kl(model, start, rows, 2, half, kv8=False) != held_kl(model, start, rows, 2, half)
    spec, log = train_end_to_end(float_model(), [], start, steps=4, batch=2, lr=1e-2, state=tmp_path,
                                 rows=(rows, half), kv8=False)
    settings = json.loads((tmp_path / "log.json").read_text())["settings"]
    assert settings["kv8"] is False and len(settings["weighted_rows"]) == 64  # the rows' and weights' sha256
    held = torch.arange(len(rows)) % HELD_OUT == HELD_OUT - 1
    assert log["held_kl_start"] == pytest.approx(held_kl(float_model(), start, rows[held], 2, half[held], kv8=False),
                                                 rel=1e-5)
    with pytest.raises(ValueError, match="other settings"):  # the same run with int8 values does not resume it
        train_end_to_end(float_model(), [], start, steps=4, batch=2, lr=1e-2, state=tmp_path, rows=(rows, half))


def test_held_text_rows_weigh_exactly_the_positions_the_ablation_scores(monkeypatch):
    """Whole held rows packed into rows of `length` (longest first, first row with room, end-of-text padding);
    weight 1 exactly at the positions predicting a reply's tokens (start .. len - 2 of each held row)."""
    import bench.quant
    import core.loading
    from scripts.fit_fpt_spec import held_text_rows

    held = [(list(range(30, 36)), 1), (list(range(10, 20)), 3), (list(range(50, 58)), 4)]
    monkeypatch.setattr(bench.quant, "held_rows", lambda tokenizer: held)
    monkeypatch.setattr(core.loading, "load_tokenizer", lambda hf_dir: None)
    rows, weights = held_text_rows(None, 16, eos=99)
    assert rows.tolist() == [list(range(10, 20)) + list(range(30, 36)), list(range(50, 58)) + [99] * 8]
    expected = torch.zeros(2, 16)
    expected[0, 3:9] = 1  # the 10-token row from 0: start 3, positions 3..8
    expected[0, 11:15] = 1  # the 6-token row from 10: start 1, positions 11..14
    expected[1, 4:7] = 1  # the 8-token row: start 4, positions 4..6
    assert torch.equal(weights, expected) and weights.sum() == sum(len(ids) - 1 - start for ids, start in held)
    with pytest.raises(SystemExit, match="--length"):
        held_text_rows(None, 9, eos=99)
