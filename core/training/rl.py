"""Budget-forcing RL of a reasoning LoRA adapter (GRPO with the soft-barrier length reward); `ponder train rl` is
core.training.rl_cli.

One step = one question and one budget B drawn from the budgets, stated in the system prompt exactly as at
inference (`reasoning_system(B)`). G rollouts share ONE base-model prefill (prompt + `<think>\\n`) and are decoded
together by the engine's decode loop (`core.decode.rows`), which closes a trace itself at B thinking tokens. Reward =
correct (math-verify, `core.reasoning.voting.is_correct` on the answer) × barrier(L; B, m)
(`core.training.rewards`). L counts every
sampled token, thinking and answer (`length="total"`, the paper's choice: a thinking-only L is gamed by closing
`</think>` early and reasoning on in the answer; `length="thinking"` is there for comparison). The forced close
is fed by the engine, not sampled, so it counts in neither L nor the loss.

On a quantized base (w4/w8/w4-fpt) the rollouts are decoded by a second engine: the int4/int8 model as the app
serves it (packed kernels, the int8 KV cache, the fused decode step with the adapter on where it applies), its
adapter overwritten with the trained one's tensors before every step. The update runs on the base's exact
dequantized copy with dense kernels for backward (QAMR). The two compute the same function up to kernel rounding
(and the cache's int8 rounding), the way RL frameworks decode with an inference engine and train with another;
what is left of the difference is corrected by truncated importance sampling (Yao et al., 2025): the rollout
engine records each sampled token's log-prob, and each token's surrogate is weighed by min(π_train/π_rollout, C),
C = `tis_cap` (`core.training.rewards.tis_weights`); the log reports the mean |log π_train − log π_rollout|.
Decoding on the dense fp32 training copy cost ~3× as long a step (4 rows, one thread each: 635 against 205 ms
with another job on the second core).

The update is the same two-pass masked forward as SFT: the prefix runs base-only without gradient (its cache is
exactly what inference reuses), the response runs with the adapter on; per-token log-probs of the sampled tokens
at the rollout temperature. The first thinking token is predicted by the base prefill, does not depend on the
adapter, and is left out of the loss. Old log-probs are those of the rollout weights, taken from the first
update pass (same weights, no extra forward). The model stays in eval mode (no LoRA dropout), so old and new
log-probs agree exactly before the first optimizer step.

Reference policy: a frozen copy of the STARTING adapter (its tensors swapped in for one no-grad pass), not the
adapter-off base. The run starts from an SFT reasoning adapter; the base model does not write `<think>` traces,
so a KL to it would pull every thinking token out of the format SFT taught, while the KL to the starting adapter
keeps the policy near a working reasoner and acts as the paper's length knob (β_KL).

Run folder (`core.training.checkpoint.RunDir`, default `data_dir()/training/<name or "rl">`): args.json, log.jsonl (every
event; one `rl_progress` per step with reward, length, accuracy, budget, cut share, KL, loss, seconds),
checkpoint/ (exact trainable tensors, optimizer moments, state.json with the step log), reward/length/accuracy
PNGs, adapter/ (the final one). A `STOP` file there, SIGINT or SIGTERM: finish the step, checkpoint, stop.
Each step's question, budget and sampling seed derive from (seed, step), so a resumed run draws what an
uninterrupted one would have.
"""
from __future__ import annotations

import hashlib
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from core.adapters import lora as adapters
from core.config import EngineConfig, SamplingConfig
from core.data.sft import example_from_row, read_jsonl
from core.decode.cache import fork, new_cache
from core.decode.rows import decode_rows, new_row
from core.decode.sampling import make_generator
from core.engine import Engine
from core.loading import component_dirs, load_model, load_tokenizer, set_threads
from core.prompting.prompts import reasoning_system
from core.reasoning.voting import is_correct
from core.storage.model_store import ModelStore
from core.training.checkpoint import (
    RunDir,
    check_data_present,
    check_resume_data,
    load_checkpoint,
    read_state,
    save_checkpoint,
)
from core.training.masked_sft import lr_at
from core.training.rewards import apply_update, group_advantages, policy_update, reward
from core.training.rl_plots import write_curves
from models.convert import AtomicDir
from models.quantization import PRECISIONS, dequantized_copy
from models.registry import DEFAULT_MODEL_ID, default_precision

LENGTHS = ("total", "thinking")


@dataclass(frozen=True)
class RlArgs:
    """Budget-forcing GRPO of a reasoning adapter."""

    data: tuple[str, ...] = ()
    """GSM8K / MATH / trace JSONL files (core.data.sft rows); only the question and the gold answer are used."""
    adapter: str | None = None
    """Starting adapter: a folder, or a name in the adapter library; None = the model's reasoning component."""
    budgets: tuple[int, ...] = (128, 256, 512)
    margin: float = 0.25
    """Soft-barrier half window m: reward falls from 1 at (1−m)·B to 0 at (1+m)·B."""
    group: int = 8
    """Rollouts per question (G), from one shared prefill."""
    questions: int = 1
    """Questions per optimizer step (GRPO's batch of prompts): each question's G rollouts get their own group
    advantages, and the groups' gradients are averaged into one update (one question a step is a noisy step)."""
    steps: int = 50
    lr: float = 2e-5
    warmup_ratio: float = 0.05
    kl: float = 0.02
    """β of the k3 KL to the starting adapter."""
    clip: float = 0.2
    updates: int = 1
    """Optimizer steps on each rollout group (μ); the ratio clip matters only above 1."""
    tis_cap: float = 2.0
    """Truncated importance sampling: each token's surrogate weighed by min(π_train / π_rollout, cap), the
    rollout engine's int4/int8 probabilities against the trained copy's; 0 turns it off."""
    temperature: float = 1.0
    answer_tokens: int = 64
    """Cap on answer tokens after the trace."""
    length: str = "total"
    """What L counts: 'total' (thinking + answer, sampled tokens) or 'thinking'."""
    model_id: str = DEFAULT_MODEL_ID
    precision: str | None = None
    """Base the adapter is trained on (QAMR; None = the model's default weights); w4/w8/w4-fpt run as their exact
    dequantized copy."""
    compute: str = "fp32"
    """dtype rollouts and updates compute in: fp32 (the same grid weights, and about twice as fast as bf16 for
    batch-4 decoding on our 2-core CPU) or bf16 (half the memory)."""
    run_dir: str | None = None
    checkpoint_every: int = 10
    seed: int = 0
    threads: int | None = None
    name: str | None = None
    """Save the result into the adapter library under this name (kind 'reasoning')."""

    def __post_init__(self):
        if self.precision is None:
            object.__setattr__(self, "precision", default_precision(self.model_id))
        checks = [(bool(self.data), "give at least one data file (--data)"),
                  (bool(self.budgets) and min(self.budgets) >= 1, "budgets must be positive token counts"),
                  (0 <= self.margin <= 1, "margin must be in [0, 1]"), (self.group >= 2, "group must be >= 2"),
                  (min(self.steps, self.updates, self.checkpoint_every, self.answer_tokens) >= 1,
                   "steps, updates, checkpoint_every and answer_tokens must be >= 1"),
                  (0 < self.lr < 1 and self.temperature > 0, "lr must be in (0, 1) and temperature > 0"),
                  (self.kl >= 0 and self.clip > 0, "kl must be >= 0 and clip > 0"),
                  (self.length in LENGTHS, f"length must be one of {LENGTHS}"),
                  (self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}"),
                  (self.compute in ("fp32", "bf16"), "compute must be fp32 or bf16")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass
class Sample:
    """One rollout: the response ids as fed to the model, which of them were sampled, and its score."""

    ids: list[int]
    sampled: list[bool]
    thinking_tokens: int
    answer_tokens: int
    budget_hit: bool
    text: str
    logprobs: list[float] | None = None
    """Each id's log-prob under the rollout engine where it was sampled (NaN for fed ids): truncated
    importance sampling weighs the update by how far the trained weights' log-probs are from these."""
    correct: bool = False
    length: int = 0
    reward: float = 0.0


def load_problems(paths: list[str]) -> list[tuple[str, str]]:
    """(question, gold) pairs from GSM8K / MATH / trace JSONL files."""
    problems = []
    for p in paths:
        problems += [(ex.question, ex.gold) for ex in map(example_from_row, read_jsonl(Path(p)))]
    if not problems:
        raise ValueError("the data files hold no questions")
    return problems


@torch.no_grad()
def rollout(engine: Engine, question: str, budget: int, args: RlArgs, seed: int) -> tuple[list[int], list[Sample]]:
    """G samples from one base prefill, decoded as one batch without autograd (the update recomputes what it
    needs); returns the prefix ids and the samples."""
    ids = engine.prompt_ids(question, reasoning_system(budget))
    cache = new_cache(engine.model.config, engine.kv)
    logits, _ = engine.open_prompt(ids, "reason", cache)
    cache = fork(cache, args.group)
    cfg = SamplingConfig(temperature=args.temperature, top_p=1.0, top_k=0, repetition_penalty=1.0,
                         max_tokens=args.answer_tokens, seed=seed)
    rows = [new_row(i, engine.tokenizer, engine.markers, cfg, reasoning=True, think_limit=budget,
                    answer_limit=args.answer_tokens, logprobs="sampling") for i in range(args.group)]
    for _event in decode_rows(engine.model, cache, logits.expand(args.group, -1), rows, tokenizer=engine.tokenizer,
                              markers=engine.markers, eos_ids=engine.eos_ids, cfg=cfg, generator=make_generator(seed),
                              fused=engine.fused_step(engine.slots.reasoning)):
        pass
    samples = []
    for row in rows:
        close = list(engine.markers.forced_close) if row.forced else []
        think = len(row.thinking_ids)
        samples.append(Sample(row.thinking_ids + close + row.answer_ids,
                              [True] * think + [False] * len(close) + [True] * len(row.answer_ids),
                              think, len(row.answer_ids), row.budget_hit, row.answer_text(engine.markers),
                              logprobs=row.logprobs[:think] + [float("nan")] * len(close) + row.logprobs[think:]))
    return ids + list(engine.markers.think_open), samples


def rollout_engine(engine: Engine) -> Engine:
    """The engine that decodes rollouts, holding the trained adapter's current weights: the served quantized
    model (`engine.rollouts`, set by `setup` for w4/w8/w4-fpt bases) or else the training model itself."""
    served = getattr(engine, "rollouts", None)
    if served is None:
        return engine
    current = dict(served.model.named_parameters())
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if p.requires_grad:
                current[name].copy_(p)
    return served


def score(samples: list[Sample], gold: str, budget: int, args: RlArgs) -> None:
    for s in samples:
        s.correct = is_correct(s.text, gold)
        s.length = s.thinking_tokens + (s.answer_tokens if args.length == "total" else 0)
        s.reward = reward(s.correct, s.length, budget, args.margin)


# --- setup and the loop ---------------------------------------------------------------------------------------
def resolve_adapter(args: RlArgs, installed) -> Path:
    if args.adapter is None:
        found = component_dirs(installed, "reasoning")
        if not found or not (found[0] / "adapter_model.safetensors").is_file():
            raise ValueError(f"{args.model_id} has no reasoning adapter to start from; pass --adapter")
        return found[0]
    folder = Path(args.adapter).expanduser()
    if (folder / "adapter_model.safetensors").is_file():
        return folder
    from core.adapters.library import AdapterLibrary

    return AdapterLibrary().get(args.model_id, args.adapter).folder


def data_hash(paths) -> str:
    digest = hashlib.sha256()
    for p in paths:
        digest.update(Path(p).read_bytes())
    return digest.hexdigest()[:16]


def setup(args: RlArgs, store: ModelStore | None = None):
    """(installed, engine around the trainable peft model, reference tensors, optimizer, problems, meta)."""
    installed = (store or ModelStore()).get(args.model_id)
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    problems = load_problems(list(args.data))
    start = resolve_adapter(args, installed)
    fingerprint = adapters.base_fingerprint(installed.hf_dir)
    if adapters.adapter_meta(start).get("base_fingerprint") not in (None, fingerprint):
        raise ValueError(f"the adapter in {start} was trained on other base weights")
    adapters.check_adapter(start)
    weights = EngineConfig(model_id=args.model_id, precision=args.precision)
    tokenizer = load_tokenizer(installed.hf_dir)
    base = load_model(installed, weights)
    if args.precision.startswith("w"):
        base = dequantized_copy(base)  # the quantized base's function, dense kernels for backward
    base = base.float() if args.compute == "fp32" else base.to(torch.bfloat16)
    model = adapters.load_adapter(base, start, trainable=True)
    engine = Engine(model, tokenizer, model_id=args.model_id, precision=args.precision,
                    kv="bf16", adapter_name=adapters.ADAPTER_NAME)
    if args.precision.startswith("w"):  # rollouts on the int4/int8 kernels the app serves with
        served = adapters.load_adapter(load_model(installed, weights), start)
        engine.rollouts = Engine(served, tokenizer, model_id=args.model_id, precision=args.precision, kv=weights.kv,
                                 adapter_name=adapters.ADAPTER_NAME)
    params = [p for p in model.parameters() if p.requires_grad]
    ref = [p.detach().clone() for p in params]
    optim = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    meta = {"kind": "reasoning", "name": args.name, "base_model": args.model_id, "base_precision": args.precision,
            "base_fingerprint": fingerprint, "data_hash": data_hash(args.data), "start_adapter": str(start),
            "recipe": {"method": "budget-rl", **asdict(args)}}
    return installed, engine, ref, optim, problems, meta



def step_update(model, optim, groups: list[tuple], ref: list[torch.Tensor], args: RlArgs) -> dict:
    """The step's update from its groups (budget, prefix, samples, advantages): one question as before (its own
    `updates`), or several averaged into one optimizer step. Groups of equal rewards carry no signal and add
    nothing; with none left there is no update."""
    live = [g for g in groups if any(g[3])]
    if not live:
        return {"loss": 0.0, "kl": None, "skipped": True}
    kw = {"clip": args.clip, "kl": args.kl, "temperature": args.temperature, "tis_cap": args.tis_cap}
    if len(groups) == 1:
        return {**policy_update(model, optim, *live[0][1:], ref, updates=args.updates, **kw), "skipped": False}
    parts = [policy_update(model, optim, prefix, samples, adv, ref, scale=1 / len(groups), apply=False, **kw)
             for _, prefix, samples, adv in live]
    apply_update([p for p in model.parameters() if p.requires_grad], optim)
    mean = lambda key: sum(p[key] for p in parts if p.get(key) is not None) / len(parts)  # noqa: E731
    return {"loss": sum(p["loss"] for p in parts), "kl": mean("kl"), "mismatch": mean("mismatch"),
            "tis_capped": mean("tis_capped"), "skipped": False, "groups_updated": len(live)}


def step_entry(step: int, budget: int, samples: list[Sample], stats: dict, lr: float, skipped: bool,
               times: tuple[float, float, float]) -> dict:
    """One step's log line; `times` = (start, rollouts done, CPU time at start) for wall and CPU seconds."""
    n = len(samples)
    return {"step": step, "budget": budget, "reward": round(sum(s.reward for s in samples) / n, 4),
            "length": sum(s.length for s in samples) / n, "thinking": sum(s.thinking_tokens for s in samples) / n,
            "accuracy": sum(s.correct for s in samples) / n, "cut_share": sum(s.budget_hit for s in samples) / n,
            "kl": stats["kl"], "loss": round(stats["loss"], 6), "mismatch": stats.get("mismatch"),
            "tis_capped": stats.get("tis_capped"), "lr": lr, "skipped": skipped,
            **({"groups_updated": stats["groups_updated"]} if "groups_updated" in stats else {}),
            "seconds": round(time.perf_counter() - times[0], 2), "rollout_s": round(times[1] - times[0], 2),
            "cpu_s": round(time.process_time() - times[2], 2)}


def summary(log: list[dict], last: int = 20) -> dict:
    tail = log[-last:]
    return {k: round(sum(e[k] for e in tail) / len(tail), 4) for k in ("reward", "length", "accuracy", "cut_share")
            } if tail else {}


def run(args: RlArgs, rd: RunDir, *, store: ModelStore | None = None, resume: bool = False) -> Path | None:
    """Train (or resume) with events, checkpoints and stop requests, then save. Returns the final adapter folder
    (the library's with `name`); None when stopped (resumable from the checkpoint)."""
    if args.name:
        from core.adapters.cards import validate_adapter_name

        validate_adapter_name(args.name)
    if resume and rd.has_checkpoint():  # the questions must be those the checkpoint was trained on
        check_data_present(args.data)
        check_resume_data(read_state(rd.checkpoint).get("data_hash"), data_hash(args.data), args.data)
    installed, engine, ref, optim, problems, meta = setup(args, store)
    model = engine.model
    rd.emit({"event": "loaded", "examples": len(problems), "total_steps": args.steps},
            f"{len(problems)} questions, {args.steps} steps, group {args.group}, budgets {list(args.budgets)}")
    start, elapsed0, log = 0, 0.0, []
    if resume and rd.has_checkpoint():
        state = load_checkpoint(rd.checkpoint, model, optim)
        start, elapsed0, log = state["step"], state["elapsed_s"], state["log"]
    spent, saved_at = 0.0, [start if resume and rd.has_checkpoint() else None]

    def checkpoint(step: int) -> None:
        saved_at[0] = step
        save_checkpoint(rd.checkpoint, model, optim, {"step": step, "elapsed_s": elapsed0 + spent, "log": log,
                                                      "args": asdict(args), "data_hash": meta["data_hash"],
                                                      "model_id": args.model_id, "recipe": meta["recipe"]})
        write_curves(log, rd.path)
        rd.emit({"event": "checkpoint", "step": step, "path": str(rd.checkpoint)})

    step = start
    while step < args.steps and not rd.should_stop():
        step += 1
        t0, cpu0 = time.perf_counter(), time.process_time()
        rng = random.Random(f"{args.seed}:{step}")  # the step's questions and budgets, the same after a resume
        lr = lr_at(step - 1, args.steps, args.lr, args.warmup_ratio)
        for group in optim.param_groups:
            group["lr"] = lr
        groups = []
        for q in range(args.questions):
            question, gold = rng.choice(problems)
            budget = rng.choice(args.budgets)
            prefix, samples = rollout(rollout_engine(engine), question, budget, args,
                                      seed=args.seed * 1_000_003 + step + 7_919 * q)
            score(samples, gold, budget, args)
            groups.append((budget, prefix, samples, group_advantages([s.reward for s in samples])))
        t1 = time.perf_counter()
        stats = step_update(model, optim, groups, ref, args)
        samples = [s for g in groups for s in g[2]]
        entry = step_entry(step, groups[0][0], samples, stats, lr, stats["skipped"], (t0, t1, cpu0))
        log.append(entry)
        spent += entry["seconds"]
        done = step - start
        rd.emit({"event": "rl_progress", "total": args.steps, **entry, "elapsed_s": round(elapsed0 + spent, 1),
                 "eta_s": round((args.steps - step) * spent / done, 1)},
                f"step {step}/{args.steps} B={entry['budget']} reward {entry['reward']:.3f} length {entry['length']:.0f} "
                f"accuracy {entry['accuracy']:.2f}{' (equal rewards: no update)' if entry['skipped'] else ''} "
                f"{entry['seconds']:.1f}s")
        if step < args.steps and step % args.checkpoint_every == 0:
            checkpoint(step)
    if saved_at[0] != step:
        checkpoint(step)
    if step < args.steps:
        rd.emit({"event": "stopped", "step": step, "resumable": True}, f"stopped after step {step}; resume with --resume")
        return None
    meta = {**meta, "steps_done": step, "metrics": summary(log), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    out = rd.path / "adapter"
    with AtomicDir(out) as tmp:
        adapters.save_adapter(model, tmp, meta)
    if args.name:
        from core.adapters.library import AdapterLibrary

        card = AdapterLibrary().add_from_folder(out, args.model_id, args.name, kind="reasoning",
                                                data_hash=meta["data_hash"], recipe=meta["recipe"],
                                                metrics=meta["metrics"])
        out = Path(card.folder)
    rd.emit({"event": "saved", "name": args.name, "folder": str(out)}, f"saved adapter to {out}")
    return out
