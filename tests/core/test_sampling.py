import threading

import pytest
import torch

from core.config import SamplingConfig
from core.decode.sampling import apply_repetition_penalty, filter_top_k_top_p, make_generator, pick_logprobs, sample_next


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0]])
    assert sample_next(logits, SamplingConfig(temperature=0, repetition_penalty=1.0), None).item() == 1


def test_same_seed_same_samples():
    logits = torch.randn(1, 50)
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    a = [sample_next(logits, cfg, g).item() for g in [make_generator(7)] for _ in range(20)]
    b = [sample_next(logits, cfg, g).item() for g in [make_generator(7)] for _ in range(20)]
    assert a == b
    assert len(set(a)) > 1  # it really samples


def test_top_k_keeps_only_k():
    logits = torch.arange(10.0).view(1, 10)
    out = filter_top_k_top_p(logits, 3, 1.0)
    assert torch.isfinite(out).sum() == 3 and torch.isfinite(out[0, 7:]).all()


def test_top_p_keeps_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = filter_top_k_top_p(probs.log(), 0, 0.7)
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_repetition_penalty_lowers_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[0, 1]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_config_validation():
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError):
        SamplingConfig(max_tokens=0)


@pytest.mark.parametrize("top_k,top_p", [(40, 0.9), (0, 0.95), (0, 0.5), (300, 0.9), (10, 1.0), (500, 1.0)])
def test_shortlist_keeps_exactly_what_the_full_filter_keeps(top_k, top_p):
    from core.decode.sampling import shortlist

    torch.manual_seed(0)
    logits = torch.randn(4, 5000) * 4  # peaked enough that most nuclei fit in the shortlist
    full = filter_top_k_top_p(logits, top_k, top_p)
    short = shortlist(logits, top_k, top_p)
    if short is None:  # the shortlist declined: only allowed when it could not be exact
        assert top_k == 0 or top_k > 256
        return
    values, ids = short
    for row in range(4):
        kept_full = set(torch.nonzero(full[row] > float("-inf")).flatten().tolist())
        kept_short = set(ids[row][values[row] > float("-inf")].tolist())
        assert kept_short == kept_full


def test_wide_nucleus_falls_back_to_the_full_sort():
    from core.decode.sampling import shortlist

    flat = torch.zeros(2, 5000)  # uniform: the 0.9 nucleus holds 4500 tokens
    assert shortlist(flat, 0, 0.9) is None
    token = sample_next(flat, SamplingConfig(temperature=1.0, top_k=0, top_p=0.9), make_generator(0))
    assert token.shape == (2,)


def test_pick_logprobs_are_the_sampled_distributions_log_probs():
    """At temperature T (no top-k/top-p) the draws follow exp(pick_logprobs): the empirical frequency of each
    token matches, and the penalty and temperature enter as in sample_next."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    cfg = SamplingConfig(temperature=0.7, top_p=1.0, top_k=0, repetition_penalty=1.3)
    seen = torch.tensor([[0]])
    tokens = torch.arange(4)
    lp = pick_logprobs(logits.expand(4, -1), tokens, cfg, seen.expand(4, -1))
    want = torch.log_softmax(torch.tensor([2.0 / 1.3, 1.0, 0.0, -1.0]) / 0.7, dim=-1)
    assert torch.allclose(lp, want, atol=1e-6)
    draws = sample_next(logits.expand(20000, -1), cfg, make_generator(0), seen.expand(20000, -1))
    freq = torch.bincount(draws, minlength=4).float() / 20000
    assert torch.allclose(freq, want.exp(), atol=0.015)
    greedy = SamplingConfig(temperature=0.0)
    assert pick_logprobs(logits, torch.tensor([0]), greedy).item() == pytest.approx(
        torch.log_softmax(logits, -1)[0, 0].item())


def test_the_two_stage_draw_over_a_large_vocabulary_is_the_softmax():
    """Past one block (1,024 entries) a draw picks a block by its summed weight, then a token in it; the padding
    behind the last block is never drawn, even in the thread's kept buffer after a wider call left numbers there."""
    vocab = 2500  # three blocks, the last one padded
    logits = torch.full((1, vocab), -30.0)
    hot = torch.tensor([3, 1023, 1024, 2047, 2499])
    logits[0, hot] = torch.tensor([1.0, 0.5, 0.0, -0.5, 0.8])
    cfg = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.0)
    gen = make_generator(0)
    sample_next(torch.full((8, 4000), 5.0), cfg, gen)  # the kept buffer now holds weights where the padding goes
    draws = torch.cat([sample_next(logits.bfloat16().expand(100, -1), cfg, gen) for _ in range(200)])
    assert draws.max().item() < vocab
    freq = torch.bincount(draws, minlength=vocab).float() / len(draws)
    want = torch.softmax(logits[0].bfloat16().float() / 0.8, -1)
    assert torch.allclose(freq[hot], want[hot], atol=0.015) and freq[hot].sum().item() > 0.99


def test_pick_logprobs_past_one_block_and_inputs_left_alone():
    torch.manual_seed(3)
    logits = torch.randn(3, 3000) * 2
    kept = logits.clone()
    seen = torch.randint(0, 3000, (3, 50))
    cfg = SamplingConfig(temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.2)
    picks = sample_next(logits, cfg, make_generator(0), seen)
    lp = pick_logprobs(logits, picks, cfg, seen)
    want = torch.log_softmax(apply_repetition_penalty(kept, seen, 1.2) / 0.7, -1).gather(1, picks[:, None])[:, 0]
    assert torch.allclose(lp, want, atol=1e-5)
    assert torch.equal(logits, kept)  # the caller's logits are read, never written
    wide = SamplingConfig(temperature=0.7, top_k=5000, top_p=1.0, repetition_penalty=1.0)  # top-k past V: no filter
    assert sample_next(logits, wide, make_generator(0)).tolist() == sample_next(
        logits, SamplingConfig(temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.0), make_generator(0)).tolist()


def test_logits_with_gradient_leave_the_buffer_usable():
    logits = (torch.randn(2, 3000) * 2).requires_grad_()
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0)
    pick_logprobs(logits * 1.0, torch.tensor([0, 1]), SamplingConfig())
    assert sample_next(logits * 1.0, greedy, None).tolist() == logits.detach().argmax(-1).tolist()


def test_greedy_takes_the_first_of_equal_maxima_in_every_row():
    logits = torch.zeros(3, 3000)
    logits[0, [5, 2000]] = 1.0
    logits[1, [2999]] = 2.0
    logits[2, [1024, 1025]] = 3.0
    picks = sample_next(logits, SamplingConfig(temperature=0, repetition_penalty=1.0), None)
    assert picks.tolist() == [5, 2999, 1024] and picks.dtype == torch.int64


def test_the_buffer_made_in_inference_mode_serves_calls_outside_it():
    cfg = SamplingConfig(temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.0)

    def work(out, errors):
        try:
            with torch.inference_mode():
                out.append(sample_next(torch.randn(2, 3000), cfg, make_generator(0)))
            out.append(sample_next(torch.randn(2, 3000), cfg, make_generator(0)))  # the same thread's buffer
            out.append(pick_logprobs(torch.randn(2, 3000), out[-1], cfg))
        except Exception as exc:  # raised again below, where pytest shows it
            errors.append(exc)

    out, errors = [], []
    worker = threading.Thread(target=work, args=(out, errors))  # a fresh thread: its buffer is made in inference mode
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    assert len(out) == 3 and torch.isfinite(out[2]).all()


@pytest.mark.parametrize("top_k,top_p", [(40, 0.9), (0, 0.9), (0, 1.0), (5000, 0.5), (40, 1.0)])
def test_a_tiny_temperature_is_near_greedy_not_a_crash(top_k, top_p):
    """Logits over 1e-40 overflow float32 to inf (inf - inf = nan: multinomial refused the row); each row's
    maximum is taken off first, which leaves the distribution as it is."""
    torch.manual_seed(1)
    logits = torch.randn(3, 3000) * 5
    cfg = SamplingConfig(temperature=1e-40, top_k=top_k, top_p=top_p, repetition_penalty=1.0)
    picks = sample_next(logits, cfg, make_generator(0))
    assert picks.tolist() == logits.argmax(-1).tolist()
    assert pick_logprobs(logits, picks, cfg).tolist() == [0.0, 0.0, 0.0]


_ops = __import__("core.decode.ops", fromlist=["ENABLED"])
needs_ops = pytest.mark.skipif(not (_ops.ENABLED and hasattr(_ops._decode_ops, "top_candidates")),
                               reason="the decode ops' C extension is not built (or built before top_candidates) or "
                                      "is turned off here")


@needs_ops
@pytest.mark.parametrize("c", [1, 40, 256])
def test_top_candidates_are_the_highest_in_id_order(c):
    """The C shortlist returns what a stable sort of each row puts first: the c highest values, equal values in
    id order (bf16 logits tie often), reading the sampler's own strided buffer and leaving it as it was."""
    from core.decode.ops import top_candidates
    from core.decode.sampling import _scratch

    torch.manual_seed(1)
    logits = (torch.randn(3, 5003) * 3).to(torch.bfloat16)
    logits[1, 4000:4100] = 40.0  # a run of equal maxima past the first blocks
    x = _scratch(logits)  # rows padded to whole blocks
    assert x.stride(0) > x.shape[1]
    before = x.clone()
    values, ids = top_candidates(x, c)
    assert torch.equal(x, before)
    for row in range(3):
        order = sorted(range(x.shape[1]), key=lambda i: (-x[row, i].item(), i))[:c]
        assert ids[row].tolist() == order
        assert torch.equal(values[row], x[row, order])
    assert top_candidates(x, x.shape[1] + 1) is None
    x[2, 4500] = float("nan")  # a NaN anywhere: no shortlist (torch's draw then fails on it, as it always did)
    assert top_candidates(x, c) is None
    with pytest.raises(RuntimeError):
        sample_next(x.clone(), SamplingConfig(temperature=0.7, top_k=40, top_p=0.9), make_generator(0))


@needs_ops
@pytest.mark.parametrize("top_k,top_p,scale", [(40, 0.9, 4), (0, 0.9, 4), (10, 1.0, 4), (300, 0.95, 4), (300, 0.95, 0.1)])
def test_draws_with_the_c_shortlist_equal_the_torch_ones(monkeypatch, top_k, top_p, scale):
    """Same seed, same picks with and without the C op (float32 logits without ties: torch.topk's order is the
    same), including the repetition penalty, several rows, pools wider than the shortlist (top-k off or 300) and
    (scale 0.1) nuclei wider than it, where the full filter takes over."""
    import core.decode.sampling as sampling

    torch.manual_seed(2)
    logits, seen = torch.randn(4, 6000) * scale, torch.randint(0, 6000, (4, 30))
    cfg = SamplingConfig(temperature=0.8, top_k=top_k, top_p=top_p, repetition_penalty=1.1)
    used, op = [], sampling.top_candidates
    monkeypatch.setattr(sampling, "top_candidates", lambda *a: used.append(a[1]) or op(*a))
    fast = [sampling.sample_next(logits, cfg, g, seen).tolist() for g in [make_generator(3)] for _ in range(30)]
    assert bool(used) == (top_p < 1.0 or 0 < top_k <= 256)  # the C scan serves every shortlist
    monkeypatch.setattr(sampling, "top_candidates", lambda *a: None)
    plain = [sampling.sample_next(logits, cfg, g, seen).tolist() for g in [make_generator(3)] for _ in range(30)]
    assert fast == plain
    assert len({tuple(p) for p in fast}) > 1  # it really samples
