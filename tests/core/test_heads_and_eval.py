"""Switcher/verifier training pipelines and `ponder eval` logic on the tiny model (real code paths, tiny sizes)."""
import json
from types import SimpleNamespace

import pytest
import torch

from core.adapters import lora as adapters
from core.config import SamplingConfig
from core.data.datasets import Item, load_items
from core.engine import Engine
from core.evaluation.evaluate import evaluate
from core.reasoning.router import Router
from core.reasoning.verifier import Verifier
from core.reasoning.voting import is_correct
from core.training.heads import platt_scaling, train_switcher, train_verifier, verifier_data, within_question_auc_oof
from models.heads import VerifierHead
from tests.tiny import make_model, make_tokenizer


@pytest.fixture(scope="module")
def engine():
    model = adapters.attach_new(make_model(448), rank=4)
    model.eval()
    return Engine(model, make_tokenizer(), model_id="tiny", context=512, adapter_name="reason")


def test_switcher_trains_saves_and_routes(engine, tmp_path):
    reason = [Item(f"What is {a}*{a + 3}? Think step by step.", str(a * (a + 3)), "gsm8k") for a in range(12)]
    chat = [Item(f"Write a short poem about the {w}.", None, "alpaca") for w in
            ["sea", "sky", "dog", "cat", "tree", "sun", "moon", "rain", "snow", "wind", "city", "road"]]
    metrics = train_switcher(engine, reason, chat, tmp_path / "sw", report=lambda m: None,
                             source={"command": "ponder train switcher --per-file 12"})
    assert metrics["n_train"] + metrics["n_val"] == 24
    # arithmetic questions against poem requests differ in every token: even the random model's pooled states
    # separate them, seen and held out (measured: probabilities within 1e-4 of 0 and 1)
    assert metrics["train_accuracy"] == metrics["val_accuracy"] == metrics["val_auc"] == 1.0
    saved = json.loads((tmp_path / "sw" / "head.json").read_text())
    assert saved["trained_on"]["command"] == "ponder train switcher --per-file 12"
    assert saved["trained_on"]["feature_seconds"] >= 0 and saved["hidden_size"] == 128
    router = Router.load(tmp_path / "sw")
    engine.router = router
    try:
        from core.config import SamplingConfig

        def route(prompt):
            return engine.generate(prompt, SamplingConfig(temperature=0, max_tokens=3), mode="auto", budget=4,
                                   answer_max_tokens=2).route

        # unseen prompts of each kind go where their kind was labelled (measured: 0.99995 and 6e-6)
        sums, poem = route("What is 3*6?"), route("Write a short poem about the river.")
        assert sums.source == poem.source == "switcher"
        assert sums.reason and sums.probability > 0.9 and sums.probability >= router.threshold
        assert not poem.reason and poem.probability < 0.1
    finally:
        engine.router = None


def _answer_444_then_555(engine):
    """A hook making the random model's sample row 0 write only the digit 4 and row 1 only 5."""
    digits = [engine.tokenizer.convert_tokens_to_ids(d) for d in "45"]

    def says(module, args, logits):
        bias = torch.zeros(logits.shape[0], 1, logits.shape[-1], dtype=logits.dtype)
        for row in range(logits.shape[0]):
            bias[row, 0, digits[row % 2]] = 1000.0
        return logits + bias

    return engine.model.get_output_embeddings().register_forward_hook(says)


def test_verifier_collection_keeps_each_candidate_once_across_a_resume(engine, tmp_path):
    """`ponder train verifier --features-cache F` writes every candidate to F.candidates.jsonl; a run that continues
    from a cache saved after question 1 drops the rows written after that save and samples question 2 again."""
    from argparse import Namespace

    from safetensors.torch import load_file, save_file

    from core.training.head_cli import candidates_path, collect_verifier_data

    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "What is 2+2?", "answer": "#### 444"}\n{"question": "What is 3+3?", "answer": "#### 555"}\n')
    items = [Item("What is 2+2?", "444", "gsm8k"), Item("What is 3+3?", "555", "gsm8k")]
    cache = tmp_path / "features.safetensors"
    args = Namespace(data=[str(data)], questions=2, offset=0, samples=2, budget=4, seed=0, features_cache=cache)
    hook = _answer_444_then_555(engine)
    try:
        whole = collect_verifier_data(engine, items, args, lambda m: None)
        first_rows = [json.loads(r) for r in candidates_path(cache).read_text().splitlines()]
        assert [r["question_index"] for r in first_rows] == [0, 0, 1, 1]
        assert [r["correct"] for r in first_rows] == [bool(v) for v in whole["y"]]
        # as a stop after the first question's save leaves it: the cache holds question 1, the file both
        saved = load_file(str(cache))
        from safetensors import safe_open

        with safe_open(str(cache), "pt") as f:
            meta = f.metadata()
        first = {k: saved[k][:2] for k in ("x", "y", "groups", "extras")}
        save_file({**first, "done": torch.tensor([1]), "seconds": saved["seconds"]}, str(cache), metadata=meta)
        with candidates_path(cache).open("a") as f:  # and a line cut short by the crash
            f.write('{"question_index": 1, "text": "half a')
        again = collect_verifier_data(engine, items, args, lambda m: None)
    finally:
        hook.remove()
    rows = [json.loads(r) for r in candidates_path(cache).read_text().splitlines()]
    assert [r["question_index"] for r in rows] == [0, 0, 1, 1]  # question 2 once, sampled again
    assert rows[:2] == first_rows[:2] and [r["text"] for r in rows[2:]] == [r["text"] for r in first_rows[2:]]
    assert torch.equal(again["y"], whole["y"]) and [r["correct"] for r in rows] == [bool(v) for v in again["y"]]



def test_a_finished_verifier_cache_grows_when_asked_for_more_questions(engine, tmp_path):
    """A cache finished at one question continues to two when rerun with --questions 2 (each question seeded by its
    index, so it holds what one run of two draws); asked for fewer, it reads its first ones; asked for more than
    an unfinished larger cache holds, it refuses."""
    from argparse import Namespace

    import pytest

    from core.training.head_cli import candidates_path, collect_verifier_data

    data = tmp_path / "q.jsonl"
    items = [Item("What is 2+2?", "444", "gsm8k"), Item("What is 3+3?", "555", "gsm8k")]
    cache, whole_cache = tmp_path / "grown.safetensors", tmp_path / "whole.safetensors"
    args = dict(data=[str(data)], offset=0, samples=2, budget=4, seed=0)
    hook = _answer_444_then_555(engine)
    try:
        whole = collect_verifier_data(engine, items, Namespace(**args, questions=2, features_cache=whole_cache),
                                      lambda m: None)
        collect_verifier_data(engine, items[:1], Namespace(**args, questions=1, features_cache=cache), lambda m: None)
        said = []
        grown = collect_verifier_data(engine, items, Namespace(**args, questions=2, features_cache=cache), said.append)
        assert said[0] == f"features: continuing {cache} after 1 questions"  # question 1 not sampled again
        # asked for fewer: its first questions, as a run of that many draws them (the grown cache stays whole)
        first = collect_verifier_data(engine, items[:1], Namespace(**args, questions=1, features_cache=cache),
                                      said.append)
        assert said[-1].startswith("features: reusing the first 1 of 2 questions")
        assert torch.equal(first["y"], whole["y"][:2]) and torch.equal(first["x"], whole["x"][:2].float())
        assert first["answers"] == whole["answers"][:2] and first["groups"].tolist() == [0, 0]
        # a 3-question run stopped after 1 question: its first question can be read, not two
        three = tmp_path / "three.safetensors"
        collect_verifier_data(engine, items[:1], Namespace(**args, questions=1, features_cache=three), lambda m: None)
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file

        with safe_open(str(three), "pt") as f:
            meta = f.metadata()
        save_file(load_file(str(three)), str(three), metadata={**meta, "questions": "3"})
        with pytest.raises(SystemExit, match="holds 1 of its 3 questions"):
            collect_verifier_data(engine, items, Namespace(**args, questions=2, features_cache=three), lambda m: None)
        two = {**args, "data": [str(data), str(tmp_path / "r.jsonl")]}  # a longer run would reorder two files' rows
        collect_verifier_data(engine, items, Namespace(**two, questions=2, features_cache=tmp_path / "two.st"),
                              lambda m: None)
        with pytest.raises(SystemExit, match="other questions"):
            collect_verifier_data(engine, items + items, Namespace(**two, questions=4,
                                                                   features_cache=tmp_path / "two.st"), lambda m: None)
    finally:
        hook.remove()
    assert torch.equal(grown["y"], whole["y"]) and torch.equal(grown["groups"], whole["groups"])
    assert grown["x"].dtype == torch.float32 and torch.equal(grown["x"], whole["x"].float())
    assert load_file(str(cache))["x"].dtype == torch.bfloat16  # the tiny bf16 model's states are bf16 values
    reused = collect_verifier_data(engine, items, Namespace(**args, questions=2, features_cache=cache), said.append)
    assert said[-1].startswith("features: reusing") and reused["x"].dtype == torch.float32
    assert reused["answers"] == [json.loads(r)["final_answer"] for r in candidates_path(cache).read_text().splitlines()]
    rows = [json.loads(r) for r in candidates_path(cache).read_text().splitlines()]
    assert [r["text"] for r in rows] == [json.loads(r)["text"] for r in candidates_path(whole_cache).read_text().splitlines()]

def test_a_collection_records_the_asked_layers_beside_the_final_state(engine, tmp_path):
    """--layers 0,1,2 on the 2-layer tiny model: index 0 is a token's embedding row, 2 the final (normed) state the
    head reads, so it equals x; a resumed run keeps them; a cache recorded without them is not continued with them."""
    from argparse import Namespace

    from safetensors.torch import load_file

    from core.training.head_cli import collect_verifier_data, layer_list

    items = [Item("What is 2+2?", "444", "gsm8k"), Item("What is 3+3?", "555", "gsm8k")]
    args = dict(data=[str(tmp_path / "q.jsonl")], offset=0, samples=2, budget=4, seed=0)
    cache, plain = tmp_path / "layers.safetensors", tmp_path / "plain.safetensors"
    hook = _answer_444_then_555(engine)
    try:
        collect_verifier_data(engine, items[:1], Namespace(**args, questions=1, features_cache=cache,
                                                           layers=(0, 1, 2)), lambda m: None)
        data = collect_verifier_data(engine, items, Namespace(**args, questions=2, features_cache=cache,
                                                              layers=(0, 1, 2)), lambda m: None)
        # read as it is, or its first question, by a run without --layers
        plainly = collect_verifier_data(engine, items, Namespace(**args, questions=2, features_cache=cache),
                                        lambda m: None)
        first = collect_verifier_data(engine, items[:1], Namespace(**args, questions=1, features_cache=cache),
                                      lambda m: None)
        collect_verifier_data(engine, items[:1], Namespace(**args, questions=1, features_cache=plain), lambda m: None)
        with pytest.raises(SystemExit, match=r"other layers \(layers=\[\]\)"):
            collect_verifier_data(engine, items, Namespace(**args, questions=2, features_cache=plain,
                                                           layers=(0, 1, 2)), lambda m: None)
    finally:
        hook.remove()
    deep = data["layers"].float()
    assert deep.shape == (4, 3, 128) and load_file(str(cache))["layers"].shape == (4, 3, 128)
    torch.testing.assert_close(deep[:, 2], data["x"].float(), atol=0, rtol=0)
    assert torch.equal(plainly["x"], data["x"]) and torch.equal(first["layers"].float(), deep[:2])
    table = engine.model.get_input_embeddings().weight.detach().float()
    assert all(bool((table == row).all(1).any()) for row in deep[:, 0])  # each an embedding row
    assert not torch.equal(deep[:, 1], deep[:, 2]) and not torch.equal(deep[0, 1], deep[1, 1])
    assert layer_list("8,12") == (8, 12)
    for bad in ("8,8", "-1", "x"):
        with pytest.raises(Exception, match="layer indices"):
            layer_list(bad)


def test_a_verifier_cache_keeps_states_in_bfloat16_only_where_exact():
    """The cache halves its states' bytes when they are bf16 values (a bf16 model's), and keeps any others."""
    from core.training.head_cli import compact

    exact = torch.randn(5, 8, generator=torch.Generator().manual_seed(0)).bfloat16().float()
    assert compact(exact).dtype == torch.bfloat16 and torch.equal(compact(exact).float(), exact)
    finer = exact.clone()
    finer[2, 3] = 1.0 + 2 ** -20
    assert compact(finer) is finer


def test_vote_accuracy_counts_or_weighs_each_questions_candidates():
    """Question 0: "1" twice (wrong), "2" once (right); question 1: "3" twice (right), "4" once (wrong)."""
    from core.training.combiner import vote_accuracy

    answers, y, groups = ["1", "1", "2", "3", "4", "3"], torch.tensor([0., 0, 1, 1, 0, 1]), torch.tensor([0, 0, 0, 1, 1, 1])
    assert vote_accuracy(answers, y, groups) == 0.5  # the count: question 1 only
    assert vote_accuracy(answers, y, groups, torch.tensor([.1, .1, .9, .1, .9, .1])) == 0.5  # question 0 only
    assert vote_accuracy(answers, y, groups, y + 0.01) == 1.0


def test_the_saved_vote_rule_is_the_one_whose_out_of_fold_vote_wins():
    """With a right answer outvoted 3 to 1 in every question a perfect head's weighted vote wins and a constant
    combiner (a count, no better) is not kept; with the right answer in the majority and a head that prefers the
    wrong one, the plain count is saved."""
    from core.training.heads import pick_vote

    groups = torch.arange(20).repeat_interleave(4)
    constant = torch.zeros(80, 4)
    y = torch.tensor([1., 0, 0, 0]).repeat(20)
    answers = ["7", "5", "5", "5"] * 20
    chosen = pick_vote(answers, y, groups, y * 0.98 + 0.01, constant, combiner := {"l2": 1.0})
    assert chosen["vote"] == "weighted" and not combiner["kept"]
    assert chosen["vote_oof"]["majority"] == 0.0 and chosen["vote_oof"]["head"] == 1.0
    y = 1 - y
    answers = ["5", "7", "7", "7"] * 20
    chosen = pick_vote(answers, y, groups, 1 - y * 0.98 - 0.01, constant, combiner := {"l2": 1.0})
    assert chosen["vote"] == "majority"
    assert chosen["vote_oof"]["majority"] == 1.0 and chosen["vote_oof"]["head"] == 0.0


def test_verifier_data_and_training(engine, tmp_path):
    """The random model is made to answer: sample row 0 writes only the digit 4, row 1 only 5 (a logit bias no CPU's
    rounding moves), so each answer's label is known: "Final answer: 444" is right for a gold 444 and wrong for
    555, whatever the question. The labels must come from each candidate's own answer against its own gold."""
    items = [Item("What is 2+2?", "444", "gsm8k"), Item("What is 3+3?", "555", "gsm8k")]
    hook = _answer_444_then_555(engine)
    saves, recorded = [], []
    quiet = dict(samples=2, budget=4, answer_max_tokens=3, report=lambda m: None)
    try:
        whole = verifier_data(engine, items, record=lambda k, item, rows: recorded.extend(rows), **quiet)
        first = verifier_data(engine, items[:1], save=saves.append, save_every=1, **quiet)
        # resumed from the saved state: the first question is not sampled again, the second as in one run
        data = verifier_data(engine, items, start=saves[-1], **quiet)
    finally:
        hook.remove()
    assert first["done"] == 1 and [s["done"] for s in saves] == [1, 1] and data["done"] == 2
    x, y, groups, extras = data["x"], data["y"], data["groups"], data["extras"]
    assert torch.equal(y, whole["y"]) and torch.equal(groups, whole["groups"])
    torch.testing.assert_close(x, whole["x"], atol=0.05, rtol=0.05)  # a prompt cache may round the last bits
    torch.testing.assert_close(extras, whole["extras"], atol=0.02, rtol=0.02)
    assert x.shape == (4, 128) and groups.tolist() == [0, 0, 1, 1]
    # each question's two answers differ (444 / 555): a vote share of one half each; log-probs of sampled tokens
    assert extras[:, 2].tolist() == [0.5] * 4 and bool((extras[:, :2] <= 0).all())
    assert y.tolist() == [1.0, 0.0, 0.0, 1.0]  # 444 right then 555 wrong; 444 wrong then 555 right
    # each candidate's record agrees with its label, vote share and question
    assert [(r["question_index"], r["correct"], r["gold"]) for r in recorded] == [
        (0, True, "444"), (0, False, "444"), (1, False, "555"), (1, True, "555")]
    assert [r["final_answer"] for r in recorded] == ["444", "555", "444", "555"]
    assert all(r["vote_share"] == 0.5 and r["thinking_tokens"] >= 1 and r["text"] for r in recorded)
    assert not torch.equal(x[0], x[1])  # each answer's own hidden state, not one row per question
    metrics = train_verifier(x, y, groups, tmp_path / "v", hidden_size=128, model_id="tiny", precision="bf16",
                             extras=extras, answers=[r["final_answer"] for r in recorded])
    assert metrics["n_train"] + metrics["n_val"] == 4
    # the combiner is fitted and reported; it is saved only when its out-of-fold vote beats the head's
    saved = json.loads((tmp_path / "v" / "head.json").read_text())
    assert metrics["combiner_fit"]["n"] == 4 and ("combiner" in saved) == metrics["combiner_fit"]["kept"]
    votes = saved["vote_oof"]
    assert votes == metrics["vote_oof"] and set(votes) == {"majority", "head", "combiner", "note"}
    assert metrics["combiner_fit"]["kept"] == (votes["combiner"] > votes["head"])
    assert saved["vote"] == ("weighted" if max(votes["head"], votes["combiner"]) > votes["majority"] else "majority")
    assert metrics["within_question_auc_oof"]["questions_with_both"] == 2
    verifier = Verifier.load(tmp_path / "v")
    assert verifier.config["calibration"] == metrics["calibration"]
    scores = verifier.scores(x[:2])
    assert len(scores) == 2
    with torch.no_grad():  # the saved scaling is what the scores apply
        raw = verifier.head(x[:2].float())
    cal = metrics["calibration"]
    torch.testing.assert_close(torch.tensor(scores), torch.sigmoid(raw * cal["scale"] + cal["shift"]))


def test_platt_scaling_undoes_an_overconfident_head():
    """Logits 8× too large (a head that separated its training set) are scaled back to the true probabilities."""
    gen = torch.Generator().manual_seed(1)
    true_logit = torch.randn(4000, generator=gen) * 1.5 - 1.0
    y = torch.bernoulli(torch.sigmoid(true_logit), generator=gen)
    fit = platt_scaling(8 * true_logit, y)
    assert abs(fit["scale"] - 1 / 8) < 0.02 and abs(fit["shift"]) < 0.15
    calibrated = torch.sigmoid(8 * true_logit * fit["scale"] + fit["shift"])
    assert (calibrated - torch.sigmoid(true_logit)).abs().max() < 0.05


def test_within_question_auc_sees_the_ranking_inside_each_question():
    """Questions differ by a large random offset (what a pooled AUC mostly learns); right answers differ from wrong
    ones of the same question along one direction. Out of fold, that ranking is found; shuffled labels give none."""
    gen = torch.Generator().manual_seed(0)
    groups = torch.arange(20).repeat_interleave(4)
    y = torch.tensor([1.0, 0.0, 0.0, 1.0] * 20)
    x = 5 * torch.randn(20, 16, generator=gen)[groups] + 0.1 * torch.randn(80, 16, generator=gen)
    x[:, 0] += y
    found = within_question_auc_oof(x, y, groups, 16, weight_decay=0.1)
    assert found["questions_with_both"] == 20 and found["auc"] > 0.9
    x[:, 0] -= y  # the direction gone: what is left is noise
    assert within_question_auc_oof(x, y, groups, 16, weight_decay=0.1)["auc"] < 0.75


def test_evaluate_reports_the_agreed_fields(engine, tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {a}+1?", "answer": f"so\n#### {a + 1}"})
                              for a in range(2)))
    items = load_items(data)
    args = SimpleNamespace(mode="reason", budget=4, answer_max_tokens=3, max_tokens=4, parallel=2, vote="majority",
                           temperature=0.7, seed=0, progress=False, data=data, system=None,
                           out=tmp_path / "result.json")
    out = evaluate(engine, items, args)
    saved = json.loads(args.out.read_text())
    assert saved["n"] == 2  # written after every question (a stopped run keeps it)
    first = saved["questions"][0]  # per-question rows, each candidate with its answer, score and correctness
    assert first["index"] == 0 and len(first["candidates"]) == args.parallel
    assert first["pass_at_n"] == any(c["correct"] for c in first["candidates"])
    for c in first["candidates"]:  # each candidate's full text is saved, so the run can be audited and re-scored
        assert isinstance(c["text"], str) and isinstance(c["thinking"], str)
        assert c["correct"] == is_correct(c["text"], items[0].gold)
    assert {"tie_majority", "tie_weighted", "tie_best"} <= first.keys()
    for key in ("n", "accuracy", "mean_thinking_tokens", "mean_answer_tokens", "budget_forced_share",
                "mean_latency_s", "accuracy_weighted", "accuracy_majority", "pass_at_n"):
        assert key in out
    assert out["n"] == 2 and 0 <= out["budget_forced_share"] <= 1 and out["mean_thinking_tokens"] <= 4


def test_bad_data_file_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "answer": "#### 1"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_items(bad)
    with pytest.raises(FileNotFoundError):
        load_items(tmp_path / "missing.jsonl")


def test_batched_greedy_evaluation_writes_as_it_goes(engine, tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {a}+1?", "answer": f"so\n#### {a + 1}"})
                              for a in range(3)))
    args = SimpleNamespace(mode="base", budget=4, answer_max_tokens=3, max_tokens=4, parallel=1, vote="weighted",
                           temperature=0.0, seed=0, progress=False, data=data, system=None, batch=2,
                           out=tmp_path / "result.json")
    out = evaluate(engine, load_items(data), args)
    saved = json.loads(args.out.read_text())
    assert out["n"] == saved["n"] == 3 and saved["partial"] is False and out["batch"] == 2
    assert [q["index"] for q in saved["questions"]] == [0, 1, 2]
    assert out["decode"] == "dense" and out["ff_keep"] is None
    engine.decode = "griffin"
    try:  # sparse decoding is an engine setting the report names
        out = evaluate(engine, load_items(data), args)
        assert out["n"] == 3 and out["decode"] == "griffin" and out["ff_keep"] == engine.ff_keep
    finally:
        engine.decode = "dense"


def test_the_combiner_learns_what_the_candidates_say_of_themselves():
    """A head whose logit is noise, and answers whose right ones are more confident and more often shared: the
    combiner ranks each question's answers far better out of fold than the head alone, the saved verifier applies
    the same regression, and the vote share alone ranks as a majority vote does."""
    from core.reasoning.verifier import combined_features, vote_shares
    from core.training.combiner import fit_combiner

    gen = torch.Generator().manual_seed(0)
    rows, y, groups = [], [], []
    for q in range(60):
        right = torch.rand(8, generator=gen) < 0.5
        answers = ["7" if r else str(10 + int(torch.randint(0, 3, (1,), generator=gen))) for r in right]
        for r, share in zip(right.tolist(), vote_shares(answers), strict=True):
            mean = (-0.3 if r else -0.6) + 0.1 * float(torch.randn(1, generator=gen))
            lowest = mean - 1.0 + 0.3 * float(torch.randn(1, generator=gen))
            score = float(torch.rand(1, generator=gen))  # the head knows nothing
            rows.append(combined_features(score, mean, lowest, share))
            y.append(float(r))
            groups.append(q)
    x, y, groups = torch.tensor(rows), torch.tensor(y), torch.tensor(groups)
    fit = fit_combiner(x, y, groups)
    alone = fit["within_question_auc_alone"]
    assert 0.35 < alone["verifier_logit"] < 0.65 and alone["logprob_mean"] > 0.85
    assert fit["within_question_auc_oof"] > 0.9 and fit["coef"][1] > 0 and fit["features"][3] == "vote_share"
    verifier = Verifier(VerifierHead(4), {"kind": "verifier", "combiner": fit})
    probs = torch.tensor(verifier.combine(rows[:16]), dtype=torch.float64)
    z = ((x[:16].double() - torch.tensor(fit["mean"])) / torch.tensor(fit["std"])) @ torch.tensor(
        fit["coef"]).double() + fit["intercept"]
    torch.testing.assert_close(probs, torch.sigmoid(z))
    assert vote_shares(["3", None, "3.0", "4"]) == [0.5, 0.0, 0.5, 0.25]  # equal answers by math-verify


def test_parallel_answers_are_scored_by_the_saved_combiner(engine):
    """With a combiner in the verifier's config, each candidate's score is the combiner's probability of its
    head score, confidence and vote share, and the vote weighs those."""
    from core.reasoning.verifier import combined_features, vote_shares

    torch.manual_seed(0)
    combiner = {"features": ["verifier_logit", "logprob_mean", "logprob_lowest", "vote_share"], "mean": [0.0] * 4,
                "std": [1.0] * 4, "coef": [0.5, 1.0, 0.5, 2.0], "intercept": -0.1}
    plain = Verifier(VerifierHead(128), {"kind": "verifier", "hidden_size": 128})
    saved = engine.verifier
    try:
        engine.verifier = plain
        sampling = SamplingConfig(temperature=1.0, seed=3)
        before = [e for e in engine.parallel("What is 2+3?", sampling, n=4, budget=4, answer_max_tokens=3)][-1].answer
        engine.verifier = Verifier(plain.head, {**plain.config, "combiner": combiner})
        after = [e for e in engine.parallel("What is 2+3?", sampling, n=4, budget=4, answer_max_tokens=3)][-1].answer
    finally:
        engine.verifier = saved
    assert [c.text for c in after.candidates] == [c.text for c in before.candidates]  # same samples
    shares = vote_shares([c.final_answer for c in before.candidates])
    want = Verifier(plain.head, {"combiner": combiner}).combine(
        [combined_features(c.score, c.logprob_mean, c.logprob_lowest, s)
         for c, s in zip(before.candidates, shares, strict=True)])
    assert [c.score for c in after.candidates] == pytest.approx(want) != [c.score for c in before.candidates]
    assert [c.head_score for c in after.candidates] == pytest.approx([c.score for c in before.candidates])
    # a combiner fitted on answers sampled at 0.7 is not applied to answers sampled at 1.0 (its log-prob inputs
    # shift with the temperature): the head's own scores stand
    engine.verifier = Verifier(plain.head, {**plain.config, "combiner": {**combiner, "temperature": 0.7}})
    try:
        far = [e for e in engine.parallel("What is 2+3?", sampling, n=4, budget=4, answer_max_tokens=3)][-1].answer
    finally:
        engine.verifier = saved
    assert [c.score for c in far.candidates] == pytest.approx([c.score for c in before.candidates])
    assert all(c.head_score is None for c in far.candidates)


def test_benefit_threshold_maximises_auto_accuracy_and_prefers_fewer_reason_routes():
    from core.training.benefit import pick_threshold

    probs = torch.tensor([0.9, 0.8, 0.3, 0.2])
    reason = torch.tensor([True, True, False, True])
    fast = torch.tensor([False, True, True, True])
    # route the first (only Reason right) to Reason: 4 of 4 at any threshold in (0.8, 0.9]; the highest wins
    assert pick_threshold(probs, reason, fast) == (pytest.approx(0.9), 1.0)
    # Fast right everywhere: nothing is routed to Reason
    threshold, acc = pick_threshold(probs, reason, torch.ones(4, dtype=torch.bool))
    assert acc == 1.0 and threshold > 0.9
    # chat prompts scored as high as the question that needs thinking: routing it would send them too, so the
    # threshold stays above them (at most 5% of chat to Reason) and Auto keeps Fast's 3 of 4
    chat = torch.tensor([0.95, 0.85, 0.1])
    threshold, acc = pick_threshold(probs, reason, fast, chat)
    assert acc == 0.75 and threshold > 0.95
    assert pick_threshold(probs, reason, fast, torch.tensor([0.1, 0.2])) == (pytest.approx(0.9), 1.0)


def test_benefit_switcher_learns_where_thinking_helped(engine, tmp_path):
    """Two evaluations of the same rows: on the multiplication questions Reason was right and Fast wrong, on the
    naming ones the reverse. The head, its threshold picked out of fold, routes each kind to the mode that was
    right (the random model's pooled states separate the two kinds, as in the topic switcher's test)."""
    from core.training.benefit import benefit_rows, load_benefit, load_benefits, train_benefit_switcher

    rows = [{"question": f"What is {a}*{a + 3}? Think step by step.", "answer": f"#### {a * (a + 3)}"}
            for a in range(10)] + [{"question": f"Name a {w}.", "answer": "#### 1"} for w in
                                   ["colour", "fruit", "river", "planet", "tree", "bird", "city", "metal", "song", "game"]]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def run(mode, right):
        return {"mode": mode, "data": str(data), "questions": [{"index": i, "correct": right(i)} for i in range(20)]}
    (tmp_path / "r.json").write_text(json.dumps(run("reason", lambda i: i < 10)))
    (tmp_path / "f.json").write_text(json.dumps(run("base", lambda i: i >= 10)))
    items, reason_right, fast_right, source = load_benefit(tmp_path / "r.json", tmp_path / "f.json")
    assert len(items) == 20 and items[3].prompt.startswith("What is 3*6?") and source["rows"] == "0-19"
    more = tmp_path / "more.jsonl"  # a second pair on another file is pooled; a question seen twice is refused
    more.write_text("".join(json.dumps({"question": f"What is {a} + {a}?", "answer": f"#### {2 * a}"}) + "\n"
                            for a in (40, 41)))
    for name, mode, right in (("r2", "reason", True), ("f2", "base", False)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"mode": mode, "data": str(more), "questions": [
            {"index": i, "correct": right} for i in (0, 1)]}))
    pooled, r2, f2, pooled_source = load_benefits([(tmp_path / "r.json", tmp_path / "f.json"),
                                                   (tmp_path / "r2.json", tmp_path / "f2.json")])
    assert [i.prompt for i in pooled[20:]] == ["What is 40 + 40?", "What is 41 + 41?"]
    assert r2 == reason_right + [True, True] and f2 == fast_right + [False, False]
    assert [p["rows"] for p in pooled_source["pairs"]] == ["0-19", "0-1"]
    with pytest.raises(ValueError, match="repeats 20 question"):
        load_benefits([(tmp_path / "r.json", tmp_path / "f.json")] * 2)
    chat = [Item(f"Write a haiku about the {w}.", None, "alpaca") for w in ["sea", "sky", "moon", "rain"]]
    metrics = train_benefit_switcher(engine, items, reason_right, fast_right, chat, tmp_path / "sw", budget=64,
                                     report=lambda m: None)
    assert metrics["thinking_helped"] == 10 and metrics["fast_only_right"] == 10
    assert metrics["reason_accuracy"] == metrics["fast_accuracy"] == 0.5 and metrics["oracle_accuracy"] == 1.0
    assert metrics["auto_accuracy_oof"] == 1.0 and metrics["reason_share_oof"] == 0.5
    router = Router.load(tmp_path / "sw")
    assert router.threshold == metrics["threshold"]
    from core.loading import use_switcher  # `ponder eval --switcher DIR`: a candidate routes auto, not the model's

    before = engine.router
    try:
        use_switcher(engine, tmp_path / "sw")
        assert engine.router.threshold == metrics["threshold"]
        assert engine.router.probability(torch.zeros(1, 3, 128)) == router.probability(torch.zeros(1, 3, 128))
        saved = json.loads((tmp_path / "sw" / "head.json").read_text())
        (tmp_path / "sw" / "head.json").write_text(json.dumps({**saved, "model": "another-model"}))
        with pytest.raises(ValueError, match="trained for another-model, not tiny"):
            use_switcher(engine, tmp_path / "sw")
    finally:
        engine.router = before
    with pytest.raises(ValueError, match="different data"):
        benefit_rows({"data": "a.jsonl", "mode": "reason"}, {"data": "b.jsonl", "mode": "base"})
    with pytest.raises(ValueError, match="Reason-mode evaluation first"):
        benefit_rows(run("base", bool), run("reason", bool))


def test_a_weight_decay_that_flips_the_weights_each_step_is_refused():
    from core.training.heads import VERIFIER_LR, WEIGHT_DECAYS, fit_head

    x, y = torch.randn(16, 4), torch.tensor([0.0, 1.0] * 8)
    with pytest.raises(ValueError, match="zeroes or flips the weights"):
        fit_head(VerifierHead(4), x, y, epochs=2, lr=VERIFIER_LR, weight_decay=1 / VERIFIER_LR)
    assert max(WEIGHT_DECAYS) * VERIFIER_LR < 1  # every strength the cross-validation tries is a stable one
