"""Budget-forcing RL: the soft barrier, GRPO advantages and the clipped KL loss by hand; rollouts from one prefill;
the update trains only the LoRA and weighs every question of a step; rollouts take the fused adapter step. Whole runs
(log, checkpoint, resume, STOP, the CLI, the int4 base): test_rl_runs.py."""
import math

import pytest
import torch

from core.tiny import make_reasoning_engine
from core.training.checkpoint import load_checkpoint, save_checkpoint
from core.training.rewards import (
    barrier,
    group_advantages,
    grpo_loss,
    k3_kl,
    policy_update,
    prefix_cache,
    reward,
    tis_weights,
    token_logprobs,
)
from core.training.rl import RlArgs, rollout, step_update

GSM = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"He has {a}+{b} = <<{a}+{b}={a + b}>>{a + b}.\n#### {a + b}"} for a, b in ((3, 4), (5, 6), (7, 1))]


def test_barrier_is_one_then_linear_then_zero():
    assert barrier(50, 100, 0.25) == 1.0 and barrier(75, 100, 0.25) == 1.0
    assert barrier(80, 100, 0.25) == pytest.approx(0.9)  # 1 - (80-75)/(125-75)
    assert barrier(100, 100, 0.25) == pytest.approx(0.5)
    assert barrier(125, 100, 0.25) == 0.0 and barrier(400, 100, 0.25) == 0.0
    assert barrier(100, 100, 0.0) == 1.0 and barrier(101, 100, 0.0) == 0.0  # m = 0: a hard step at B
    assert reward(True, 110, 100, 0.25) == pytest.approx(0.3) and reward(False, 10, 100, 0.25) == 0.0
    with pytest.raises(ValueError):
        barrier(10, 0, 0.25)


def test_group_advantages_normalise_per_group_and_equal_groups_give_zeros():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])  # mean 0.5, population std 0.5
    assert adv == pytest.approx([0.5 / (0.5 + 1e-4), -0.5 / (0.5 + 1e-4)] * 1 + [-0.5 / (0.5 + 1e-4), 0.5 / (0.5 + 1e-4)])
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.9, 0.0, 0.0]) == pytest.approx([0.6 / (math.sqrt(0.18) + 1e-4),
                                                               -0.3 / (math.sqrt(0.18) + 1e-4),
                                                               -0.3 / (math.sqrt(0.18) + 1e-4)])


def test_grpo_loss_clips_the_ratio_and_adds_the_k3_kl():
    ln = math.log
    new = torch.tensor([[ln(0.5), ln(0.5)], [ln(0.5), ln(0.9)]], requires_grad=True)
    old = torch.tensor([[ln(0.4), ln(0.5)], [ln(0.4), ln(0.1)]])
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -1.0])
    # row 0: ratio 1.25 clipped to 1.2 (A > 0) -> -1.2; ratio 1 -> -1. row 1: ratio 1.25, A < 0: min is -1.25 -> +1.25.
    loss = grpo_loss(new, old, new.detach(), adv, mask, clip=0.2, kl_coef=0.5)  # ref = new: KL term 0
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 1.25) / 3)
    loss.backward()
    # the clipped token has no gradient; the unclipped ones d(-ρA)/dlogp = -ρA, over 3 tokens; masked: 0
    assert new.grad.flatten().tolist() == pytest.approx([0.0, -1 / 3, 1.25 / 3, 0.0])
    ref = torch.full((2, 2), ln(0.25))  # k3 with ref/new = 0.5: 0.5 - ln 0.5 - 1
    k3 = 0.5 - ln(0.5) - 1
    assert k3_kl(torch.tensor(ln(0.5)), torch.tensor(ln(0.25))).item() == pytest.approx(k3)
    with_kl = grpo_loss(new.detach(), old, ref, adv, mask, clip=0.2, kl_coef=0.1)
    assert with_kl.item() == pytest.approx((-1.2 - 1.0 + 1.25) / 3 + 0.1 * k3, abs=1e-6)
    rows = sum(grpo_loss(new.detach()[i:i + 1], old[i:i + 1], ref[i:i + 1], adv[i:i + 1], mask[i:i + 1], 0.2, 0.1,
                         tokens=3) for i in range(2))  # one row at a time with the group's token count: same loss
    assert rows.item() == pytest.approx(with_kl.item(), abs=1e-6)


def test_truncated_importance_weights_cap_the_ratio_and_scale_the_surrogate():
    ln = math.log
    old = torch.tensor([[ln(0.5), ln(0.5), ln(0.9), ln(0.2)]])
    rollout = torch.tensor([[ln(0.5), ln(0.1), ln(0.6), float("nan")]])  # the last token was fed, not sampled
    w = tis_weights(old, rollout, cap=2.0)
    assert w.flatten().tolist() == pytest.approx([1.0, 2.0, 1.5, 1.0])  # 0.5/0.1 = 5 capped at 2
    assert tis_weights(old, rollout, cap=0).flatten().tolist() == [1.0] * 4  # off
    new = old.clone().requires_grad_(True)
    mask, adv = torch.ones(1, 4), torch.tensor([1.0])
    plain = grpo_loss(new, old, old, adv, mask, kl_coef=0.0)
    weighted = grpo_loss(new, old, old, adv, mask, kl_coef=0.0, weights=w)
    assert plain.item() == pytest.approx(-1.0) and weighted.item() == pytest.approx(-(1 + 2 + 1.5 + 1) / 4)
    weighted.backward()
    assert new.grad.flatten().tolist() == pytest.approx([-0.25, -0.5, -0.375, -0.25])  # the weights, no gradient


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return make_reasoning_engine()


def test_rollouts_share_one_prefill_and_respect_the_budget(engine):
    args = RlArgs(data=("x",), group=3, answer_tokens=6)
    prefix, samples = rollout(engine, "What is 17*23?", 5, args, seed=1)
    tok = engine.tokenizer
    assert "Think for at most 5 tokens" in tok.decode(prefix) and tok.decode(prefix).endswith("<think>\n")
    assert len(samples) == 3
    close = list(engine.markers.forced_close)
    for s in samples:
        assert s.thinking_tokens <= 5 and len(s.ids) == len(s.sampled)
        assert sum(s.sampled) == s.thinking_tokens + s.answer_tokens  # the forced close is fed, not sampled
        if s.budget_hit:
            assert s.ids[s.thinking_tokens:s.thinking_tokens + len(close)] == close
    # the rollouts differ (sampling at temperature 1), yet all continue the same prefix
    assert len({tuple(s.ids) for s in samples}) > 1
    # each sampled id carries the log-prob it was drawn with: the update's forward on the same weights gives it
    # again (bf16 kernels apart), token for token (the first one comes from the base prefill and is not trained)
    cache = prefix_cache(engine.model, prefix)
    for s in samples:
        assert len(s.logprobs) == len(s.ids)
        assert [math.isnan(x) for x in s.logprobs] == [not k for k in s.sampled]
        sampled = torch.tensor(s.sampled[1:])
        again = token_logprobs(engine.model, cache, s.ids, args.temperature).detach()
        assert torch.allclose(torch.tensor(s.logprobs[1:])[sampled], again[sampled], atol=0.05)


def test_grpo_raises_the_soft_barrier_reward_over_steps():
    """The whole loop on the tiny model (rollouts from one prefill, the soft-barrier reward with every answer
    counted right, group advantages, the clipped update with importance weights): the mean reward of a group of 16
    climbs from ~0.1 to near 1 within 24 steps as the model learns to end its answer early; the same run with the
    advantages negated learns the opposite. (With groups of 8 whether it climbs in 24 steps depends on the seed:
    about half of 8 seeds tried did; with 16, 5 of 5.)"""
    def run_steps(sign: float) -> list[float]:
        torch.manual_seed(0)
        engine = make_reasoning_engine()
        params = [p for p in engine.model.parameters() if p.requires_grad]
        ref = [p.detach().clone() for p in params]
        optim = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
        args = RlArgs(data=("x",), group=16, answer_tokens=8, kl=0.0)
        means = []
        for step in range(24):
            prefix, samples = rollout(engine, "What is 17*23?", 12, args, seed=step)
            rewards = [reward(True, s.thinking_tokens + s.answer_tokens, 16, 0.25) for s in samples]
            adv = [sign * a for a in group_advantages(rewards)]
            if any(adv):
                policy_update(engine.model, optim, prefix, samples, adv, ref, clip=args.clip, kl=0.0,
                              temperature=args.temperature)
            means.append(sum(rewards) / len(rewards))
        return means

    rising, falling = run_steps(1.0), run_steps(-1.0)
    assert sum(rising[:6]) / 6 < 0.3 and sum(rising[-6:]) / 6 > 0.8
    assert sum(falling[-6:]) / 6 < 0.1


def test_update_changes_only_the_lora_and_its_gradient_is_nonzero(engine, tmp_path):
    model = engine.model
    args = RlArgs(data=("x",), group=2, answer_tokens=4, lr=1e-2, kl=0.1)
    prefix, samples = rollout(engine, "What is 2+2?", 6, args, seed=3)
    named = dict(model.named_parameters())
    lora = {n for n, p in named.items() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    before = {n: p.detach().clone() for n, p in named.items()}
    cache = prefix_cache(model, prefix)
    new = token_logprobs(model, cache, samples[0].ids, args.temperature)
    mask = torch.tensor(samples[0].sampled[1:], dtype=torch.float32)
    grpo_loss(new[None], new.detach()[None], new.detach()[None], torch.tensor([1.0]), mask[None]).backward()
    assert any(named[n].grad is not None and named[n].grad.abs().sum() > 0 for n in lora)
    assert all(p.grad is None for n, p in named.items() if n not in lora)
    model.zero_grad(set_to_none=True)
    params = [named[n] for n in sorted(lora)]
    optim = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    ref = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    assert samples[0].ids != samples[1].ids  # else the two advantages cancel and no update has a direction
    advantages = [1.0, -1.0]

    def pushed() -> float:
        """Σ_i A_i · (sample i's summed log-prob over its sampled tokens): what the update is to raise."""
        with torch.no_grad():
            start = prefix_cache(model, prefix)
            return sum(a * float((token_logprobs(model, start, s.ids, args.temperature)
                                  * torch.tensor(s.sampled[1:], dtype=torch.float32)).sum())
                       for s, a in zip(samples, advantages, strict=True))

    objective = pushed()
    stats = policy_update(model, optim, prefix, samples, advantages, ref, clip=args.clip, kl=args.kl,
                          temperature=args.temperature)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6) and math.isfinite(stats["loss"])  # the ref is the start
    assert all(torch.equal(p, before[n]) for n, p in named.items() if n not in lora)  # base weights untouched
    assert any(not torch.equal(named[n], before[n]) for n in lora)
    # The step goes where the advantages point: the rewarded sample gets likelier relative to the other one.
    # Adam's first step moves every LoRA element by lr against its gradient's sign, a first-order gain of
    # lr·‖∇‖₁ in this sum (measured: +21 nats here at lr 1e-2); flipped advantages lose as much.
    assert pushed() - objective > 2.0
    # the optimizer moments round-trip through the safetensors checkpoint
    save_checkpoint(tmp_path / "checkpoint", model, optim, {"step": 1})
    fresh = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    assert load_checkpoint(tmp_path / "checkpoint", model, fresh)["step"] == 1
    assert len(fresh.state) == len(optim.state) == len(params)


def pushed(model, prefix, samples, advantages, temperature) -> float:
    """Σ_i A_i · (sample i's summed log-prob over its sampled tokens): what an update is to raise."""
    with torch.no_grad():
        start = prefix_cache(model, prefix)
        return sum(a * float((token_logprobs(model, start, s.ids, temperature)
                              * torch.tensor(s.sampled[1:], dtype=torch.float32)).sum())
                   for s, a in zip(samples, advantages, strict=True))


def test_several_questions_a_step_make_one_update_that_serves_every_group(engine):
    """GRPO's batch of prompts (`--questions`): each question's group keeps its own advantages, their gradients are
    averaged, and the optimizer steps once; groups of equal rewards add nothing, and with none left nothing moves."""
    model = engine.model
    args = RlArgs(data=("x",), group=2, answer_tokens=4, lr=1e-2, kl=0.0, questions=2)
    groups = []
    for question, seed in (("What is 2+2?", 3), ("What is 3+5?", 4)):
        prefix, samples = rollout(engine, question, 6, args, seed=seed)
        assert samples[0].ids != samples[1].ids
        groups.append((6, prefix, samples, [1.0, -1.0]))
    params = [p for p in model.parameters() if p.requires_grad]
    ref = [p.detach().clone() for p in params]
    optim = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    before = [pushed(model, g[1], g[2], g[3], args.temperature) for g in groups]
    stats = step_update(model, optim, groups, ref, args)
    assert not stats["skipped"] and stats["groups_updated"] == 2 and math.isfinite(stats["loss"])
    assert {float(s["step"]) for s in optim.state.values()} == {1.0}  # one optimizer step for both questions
    after = [pushed(model, g[1], g[2], g[3], args.temperature) for g in groups]
    assert sum(after) - sum(before) > 2.0
    frozen = [p.detach().clone() for p in params]
    dead = [(6, g[1], g[2], [0.0, 0.0]) for g in groups]
    assert step_update(model, optim, dead, ref, args)["skipped"]
    assert all(torch.equal(p, f) for p, f in zip(params, frozen, strict=True))


def test_rollouts_take_the_fused_adapter_step_and_sample_what_the_module_path_samples():
    """On packed int4 weights the rollouts run the fused decode step with the adapter on; it computes exactly what
    the peft module path computes, so the sampled rollouts are the same token for token."""
    from tests.core.test_fused_decode import lora_engine

    engine = lora_engine()
    assert engine.fused is not None
    args = RlArgs(data=("unused",), budgets=(12,), group=3, answer_tokens=4, temperature=1.0)
    calls = []
    engine.fused.with_adapter = lambda name, real=engine.fused.with_adapter: _counting(real(name), calls)
    prefix, fused = rollout(engine, "What is 17*23?", 12, args, seed=4)
    assert calls, "the rollouts took the fused step"
    engine.fused = None
    plain_prefix, plain = rollout(engine, "What is 17*23?", 12, args, seed=4)
    assert plain_prefix == prefix and [s.ids for s in plain] == [s.ids for s in fused]
    assert len({tuple(s.ids) for s in fused}) > 1


def _counting(adapter_step, calls):
    real = adapter_step.step

    def step(tokens, cache):
        calls.append(len(tokens))
        return real(tokens, cache)

    adapter_step.step = step
    return adapter_step
