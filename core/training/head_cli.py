"""`ponder train switcher|verifier`: collect features with the loaded engine and fit the head."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from core.config import EngineConfig
from core.data.datasets import load_items


def main(argv: list[str]) -> int:
    from core.loading import load_engine
    from core.training.heads import SAMPLING_TEMPERATURE, SAMPLING_TOP_P, train_switcher, train_verifier

    what, rest = argv[0], argv[1:]
    p = argparse.ArgumentParser(prog=f"ponder train {what}")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--seed", type=int, default=0)
    if what == "switcher":
        p.add_argument("--reason-data", action="append", help="GSM8K/MATH JSONL (label: reason)")
        p.add_argument("--chat-data", action="append", required=True, help="Alpaca JSONL (label: base)")
        p.add_argument("--benefit", nargs=2, type=Path, action="append", metavar=("REASON_EVAL", "FAST_EVAL"),
                       help="route by benefit: a Reason-mode and a Fast-mode `ponder eval --out` of the same train "
                            "rows label each question by whether thinking helped (core.training.benefit); "
                            "repeat for more rows or other data files")
        p.add_argument("--budget", type=int, default=None,
                       help="budget auto states (default: the Reason evaluation's, else the model's)")
        p.add_argument("--per-file", type=int, default=200, help="prompts taken from each file")
        p.add_argument("--features-cache", type=Path, default=None, help="safetensors file to reuse pooled features")
    else:
        p.add_argument("--data", action="append", required=True, help="GSM8K/MATH JSONL with reference answers")
        p.add_argument("--questions", type=int, default=60)
        p.add_argument("--offset", type=int, default=None,
                       help="take each file's rows from this one on, in order (default: a seeded sample)")
        p.add_argument("--samples", type=int, default=4)
        p.add_argument("--budget", type=int, default=256)
        p.add_argument("--features-cache", type=Path, default=None,
                       help="safetensors file keeping the sampled features and labels (reused when present)")
        p.add_argument("--layers", type=layer_list, default=(),
                       help="also record these layers' states at the verification prompt, comma-separated hidden-state "
                            "indices (0: the embeddings), for `python -m bench.verifier_layers`; the head is still "
                            "fitted on the final state")
    args = p.parse_args(rest)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if what == "switcher" and args.benefit:
        from core.training.benefit import load_benefits, train_benefit_switcher
        from models.registry import default_budget

        engine = load_engine(EngineConfig(model_id=args.model), reasoning=False)
        items, reason_right, fast_right, source = load_benefits(args.benefit)
        if "pairs" in source and source["budget"] is None and args.budget is None:
            raise SystemExit("ponder train switcher: the Reason evaluations thought with different budgets; give "
                             "--budget (the one auto mode will state)")
        # each file's first rows, as the topic switcher takes them: a shuffled sample could reach the chat rows
        # of the mixed dev set (scripts.make_mixed_dev: Alpaca rows 4900-4963)
        chat = [i for f in args.chat_data for i in load_items(f, args.per_file)]
        source = {**source, "chat_data": [Path(f).name for f in args.chat_data], "per_file": args.per_file,
                  "command": " ".join(["ponder", "train", what, *rest])}
        metrics = train_benefit_switcher(engine, items, reason_right, fast_right, chat, args.out,
                                         budget=args.budget or source.get("budget") or default_budget(args.model),
                                         seed=args.seed,
                                         report=say, source=source)
    elif what == "switcher":
        if not args.reason_data:
            raise SystemExit("ponder train switcher: give --reason-data (a topic switcher) or --benefit")
        engine = load_engine(EngineConfig(model_id=args.model), reasoning=False)
        reason = [i for f in args.reason_data for i in load_items(f, args.per_file, shuffle_seed=args.seed)]
        chat = [i for f in args.chat_data for i in load_items(f, args.per_file * len(args.reason_data))]
        source = {"data": [f"{Path(f).parent.name}/{Path(f).name}" for f in args.reason_data + args.chat_data],
                  "per_file": args.per_file, "seed": args.seed, "command": " ".join(["ponder", "train", what, *rest])}
        metrics = train_switcher(engine, reason, chat, args.out, seed=args.seed, report=say,
                                 features_cache=args.features_cache, source=source)
    else:
        engine = load_engine(EngineConfig(model_id=args.model), reasoning=True)
        if not engine.can_reason:
            raise ValueError("the verifier scores reasoning answers: install or train the reasoning adapter first")
        deepest = engine.model.config.num_hidden_layers
        if any(i > deepest for i in args.layers):
            raise SystemExit(f"ponder train verifier: --layers goes up to {deepest} on {args.model} "
                             f"(0: the embeddings, {deepest}: the final state)")
        per_file = max(1, args.questions // len(args.data))
        ordered = args.offset is not None
        items = [i for f in args.data for i in load_items(f, per_file, offset=args.offset or 0,
                                                          shuffle_seed=None if ordered else args.seed)]
        data = collect_verifier_data(engine, items, args, say)
        x, y, groups, sampling_seconds = data["x"], data["y"], data["groups"], data["seconds"]
        source = {"data": [f"{Path(f).parent.name}/{Path(f).name}" for f in args.data],
                  "questions": args.questions, "offset": args.offset, "samples": args.samples,
                  "budget": args.budget, "seed": args.seed,
                  "temperature": SAMPLING_TEMPERATURE, "top_p": SAMPLING_TOP_P,
                  "command": " ".join(["ponder", "train", what, *rest]),
                  "sampling_seconds": None if sampling_seconds is None else round(sampling_seconds)}
        metrics = train_verifier(x, y, groups, args.out, hidden_size=x.shape[1], model_id=engine.model_id,
                                 precision=engine.precision, seed=args.seed, source=source,
                                 extras=data.get("extras"), answers=data.get("answers"))
    print(json.dumps(metrics))
    return 0


def layer_list(text: str) -> tuple[int, ...]:
    """`--layers`: comma-separated hidden-state indices ("8,12,16"), each at least 0, none repeated."""
    try:
        layers = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of layer indices: {text!r}") from None
    if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
        raise argparse.ArgumentTypeError(f"layer indices must be distinct and at least 0: {text!r}")
    return layers


def candidates_path(cache: Path) -> Path:
    """The candidates' JSONL beside a verifier features cache."""
    return cache.with_name(cache.name + ".candidates.jsonl")


def saved_candidates(lines: list[str], done: int) -> list[str]:
    """The sidecar's rows of the first `done` questions, the ones the cache kept; a line cut short by a crash
    mid-write (always a later question's: a question is recorded before the cache saves it) is dropped."""
    kept = []
    for line in lines:
        try:
            if json.loads(line)["question_index"] < done:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    return kept


def compact(x):
    """`x` as bfloat16 where that loses nothing (a bf16 model's hidden states: half the bytes, so a 1,000-question
    cache of the 0.5B stays under the repository's 20 MB file limit), else unchanged."""
    import torch

    half = x.to(torch.bfloat16)
    return half if torch.equal(half.float(), x.float()) else x


def collect_verifier_data(engine, items, args, say) -> dict:
    """Sample (or reload) the verifier's training candidates. With --features-cache the collection is saved every
    8 questions (safetensors, written atomically) and a rerun continues where it stopped; a finished cache is
    reused as it is, or grows when a rerun on one data file asks for more questions (each question's samples are
    seeded by its index, so the first ones are those a longer run would have drawn); a rerun asking for fewer
    questions than a cache holds reads its first ones (what a run of that many draws). Caches from before the log-prob
    features hold no extras (the combiner is then skipped). Beside the cache, `<cache>.candidates.jsonl` keeps
    every candidate's text, lengths and correctness (for rejection-sampling fine-tuning and length studies), cut
    back to the saved questions when a run continues."""
    import os

    import torch
    from safetensors.torch import load_file, save_file

    from core.training.heads import verifier_data

    path, layers = args.features_cache, tuple(getattr(args, "layers", ()))
    start, spent = None, 0.0
    made_by = {"data": json.dumps([str(f) for f in args.data]), "questions": str(args.questions),
               "offset": str(args.offset),
               "samples": str(args.samples), "budget": str(args.budget), "seed": str(args.seed),
               "layers": json.dumps(list(layers))}
    unset = {"offset": "None", "layers": "[]"}  # keys a cache from before them lacks, and the value it stands for
    if path is not None and path.is_file():
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        differ = [k for k, v in made_by.items() if (k in meta or k in unset) and meta.get(k, unset.get(k)) != v
                  and not (k == "questions" and len(args.data) == 1)]
        # other questions of one file: it grows, or its first ones are read (with several files each file's share
        # changes, so the order does); other layers matter only to a run that continues it (checked below)

        def refuse(keys: list[str]) -> None:
            found = ", ".join(f"{k}={meta.get(k, unset.get(k))}" for k in keys)
            raise SystemExit(f"ponder train verifier: {path} was collected with other {', '.join(keys)} "
                             f"({found}); give another --features-cache")

        if [k for k in differ if k != "layers"]:
            refuse([k for k in differ if k != "layers"])
        saved = load_file(str(path))
        saved["x"] = saved["x"].float()  # kept as bfloat16 where that is exact (see save)
        spent = saved["seconds"].item() if "seconds" in saved else None
        done = int(saved["done"].item()) if "done" in saved else len(items)
        if "extras" in saved and done > len(items):  # the first questions of a larger cache: what a run of them draws
            first = saved["groups"] < len(items)
            saved = {**{k: v[first] for k, v in saved.items() if k in ("x", "y", "groups", "extras", "layers")},
                     "done": torch.tensor([len(items)])}
            say(f"features: reusing the first {len(items)} of {done} questions in {path} ({len(saved['y'])} "
                "candidates)")
            return {**saved, "seconds": None, "answers": sidecar_answers(path, saved, say)}
        if int(meta.get("questions", args.questions)) > args.questions and done < len(items):
            raise SystemExit(f"ponder train verifier: {path} holds {done} of its {meta['questions']} questions, fewer "
                             f"than the {len(items)} asked for; continue it with --questions {meta['questions']}")
        if "extras" not in saved or done >= len(items):
            say(f"features: reusing {path} ({len(saved['y'])} candidates)")
            return {**saved, "seconds": spent, "extras": saved.get("extras"),
                    "answers": sidecar_answers(path, saved, say)}
        if "layers" in differ:  # its saves would drop the recorded layers, or lack them for the earlier questions
            refuse(["layers"])
        start = {**saved, "done": done}
        say(f"features: continuing {path} after {done} questions")
    started = time.monotonic()
    answers: list[str | None] = []

    def record(k, item, rows) -> None:  # without a cache the answers are kept in memory
        answers.extend(r["final_answer"] for r in rows)

    if path is not None:
        sidecar = candidates_path(path)
        lines = sidecar.read_text(encoding="utf-8").splitlines() if sidecar.is_file() else []
        kept = saved_candidates(lines, start["done"] if start is not None else 0)
        if start is not None and len(kept) != len(start["y"]):
            say(f"features: {sidecar.name} holds {len(kept)} of the cache's {len(start['y'])} candidates "
                "(written before it kept them, or cut short); the cache itself is complete")
        if len(kept) != len(lines):
            tmp = sidecar.with_name(sidecar.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, sidecar)

        def record(k, item, rows) -> None:
            with sidecar.open("a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))

    def save(state: dict) -> None:
        if path is None:
            return
        seconds = (spent or 0.0) + time.monotonic() - started
        tmp = path.with_name(path.name + ".tmp")
        tensors = {"x": compact(state["x"]).contiguous(), "y": state["y"].contiguous(),
                   "groups": state["groups"].contiguous(), "extras": state["extras"].contiguous(),
                   "done": torch.tensor([state["done"]]), "seconds": torch.tensor([seconds], dtype=torch.float64)}
        if "layers" in state:
            tensors["layers"] = compact(state["layers"]).contiguous()
        save_file(tensors, str(tmp), metadata=made_by)
        os.replace(tmp, path)

    data = verifier_data(engine, items, samples=args.samples, budget=args.budget, seed=args.seed, report=say,
                         start=start, save=save, record=record, layers=layers)
    return {**data, "seconds": (spent or 0.0) + time.monotonic() - started,
            "answers": answers if path is None else sidecar_answers(path, data, say)}


def sidecar_answers(path: Path, data: dict, say) -> list[str | None] | None:
    """Each candidate's final answer from `<cache>.candidates.jsonl` (its rows of the questions in `data`; a run
    stopped between saves leaves later ones), checked against the cache's questions and labels; None, said, when
    they do not match (a cache written before the sidecar was kept): the vote rule is then chosen by AUC."""
    sidecar = candidates_path(path)
    done = int(data["done"]) if "done" in data else len(set(data["groups"].tolist()))
    rows = [json.loads(line) for line in saved_candidates(
        sidecar.read_text(encoding="utf-8").splitlines() if sidecar.is_file() else [], done)]
    if len(rows) != len(data["y"]) or any(r["question_index"] != int(g) or bool(r["correct"]) != bool(v)
                                          for r, g, v in zip(rows, data["groups"], data["y"], strict=False)):
        say(f"features: {sidecar.name} does not hold the cache's {len(data['y'])} candidates: the vote rule is "
            "chosen by within-question AUC, without votes")
        return None
    return [r["final_answer"] for r in rows]
