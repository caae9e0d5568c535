"""N streams from one prefill on the tiny model: one batch, budget per row, verifier scores, vote."""
import pytest
import torch

from core.adapters import lora as adapters
from core.config import SamplingConfig
from core.decode.cache import PonderCache, PonderDynamicCache, allocated_bytes, planned_bytes
from core.engine import Engine
from core.events import DoneEvent, PhaseEvent, TokenEvent
from core.memory import FREE_SHARE, RequestTooLarge
from core.reasoning.verifier import Verifier
from models.heads import VerifierHead, chunk_ema, load_head, save_head
from tests.tiny import make_model, make_tokenizer

SAMPLE = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, max_tokens=12, seed=1, repetition_penalty=1.0)


def make_engine(with_verifier: bool):
    model = adapters.attach_new(make_model(448), rank=4)
    model.eval()
    engine = Engine(model, make_tokenizer(), model_id="tiny", context=512, adapter_name="reason")
    if with_verifier:
        torch.manual_seed(0)
        engine.verifier = Verifier(VerifierHead(128), {"kind": "verifier", "hidden_size": 128})
    return engine


def test_four_streams_one_prefill_with_scores_and_vote():
    engine = make_engine(with_verifier=True)
    events = list(engine.parallel("What is 2+3?", SAMPLE, n=4, mode="reason", budget=6, answer_max_tokens=5))
    answer = events[-1].answer
    assert isinstance(events[-1], DoneEvent) and len(answer.candidates) == 4
    assert {e.stream for e in events if isinstance(e, TokenEvent)} <= {0, 1, 2, 3}
    for c in answer.candidates:
        assert c.thinking_tokens <= 6 and c.answer_tokens <= 5 and 0.0 < c.score < 1.0
        # its own sampled tokens' log-probs summarised (core.reasoning.confidence)
        assert c.logprob_mean < 0 and c.logprob_lowest < 0 and c.to_dict()["logprob_lowest"] == c.logprob_lowest
    assert answer.vote_method == "weighted" and answer.chosen in range(4)
    assert answer.text == answer.candidates[answer.chosen].text
    texts = {c.thinking for c in answer.candidates}
    assert len(texts) > 1  # rows really sample independently
    for i in range(4):  # each stream tells when it starts verifying and when it is done, after its last token
        mine = [e for e in events if getattr(e, "stream", None) == i]
        phases = [e.phase for e in mine if isinstance(e, PhaseEvent)]
        assert phases == ["verify", "done"]
        assert isinstance(mine[-1], PhaseEvent) and isinstance(mine[-2], PhaseEvent)


def test_a_single_stream_sends_no_phase_events():
    engine = make_engine(with_verifier=True)
    events = list(engine.parallel("What is 2+3?", SAMPLE, n=1, mode="reason", budget=6, answer_max_tokens=5))
    assert not any(isinstance(e, PhaseEvent) for e in events)


def test_streams_match_their_events_and_seed_repeats():
    engine = make_engine(with_verifier=False)
    run = lambda: list(engine.parallel("hi", SAMPLE, n=3, mode="base"))  # noqa: E731
    a, b = run(), run()
    assert [c.text for c in a[-1].answer.candidates] == [c.text for c in b[-1].answer.candidates]
    for c in a[-1].answer.candidates:
        streamed = "".join(e.text for e in a if isinstance(e, TokenEvent) and e.stream == c.index)
        assert streamed == c.text
        assert c.score is None
    assert a[-1].answer.vote_method == "majority"


def test_heads_save_and_load(tmp_path):
    head = VerifierHead(16)
    save_head(head, tmp_path / "v", {"kind": "verifier", "hidden_size": 16})
    loaded, cfg = load_head(tmp_path / "v", "verifier")
    x = torch.randn(2, 16)
    assert torch.equal(head(x), loaded(x)) and cfg["kind"] == "verifier"
    with pytest.raises(ValueError, match="switcher"):
        load_head(tmp_path / "v", "switcher")


def test_chunk_ema_matches_formula():
    h = torch.arange(6.0).view(6, 1)  # chunks of 2: means 0.5, 2.5, 4.5
    expected = 0.5 * 4.5 + 0.5 * (0.5 * 2.5 + 0.5 * 0.5)
    assert chunk_ema(h, chunk=2, alpha=0.5).item() == expected


def long_question(engine: Engine, tokens: int) -> str:
    """A question whose prompt is just under `tokens` tokens."""
    words = "What is 17*23? Let me think step by step about it."
    text = words
    while len(engine.prompt_ids(text + " " + words)) < tokens:
        text += " " + words
    return text


def fake_free_memory(monkeypatch, free: int) -> None:
    import psutil

    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=free))


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_parallel_rows_near_a_full_context_allocate_no_more_than_planned(kv):
    """Eight answers from one prompt that nearly fills the context: the cache holds a copy a row, and what it
    allocates while they decode stays within what the refusal check plans for (core.decode.cache.planned_bytes)."""
    engine = Engine(make_model(448), make_tokenizer(), model_id="tiny", context=512, kv=kv)
    question = long_question(engine, 430)
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, max_tokens=40, seed=1, repetition_penalty=1.0,
                         ignore_eos=True)
    n, most, events = 8, 0, []
    for event in engine.parallel(question, cfg, n=n, mode="base"):
        most = max(most, allocated_bytes(engine.last_cache))
        events.append(event)
    answer = events[-1].answer
    made = answer.candidates[0].answer_tokens  # every row runs to the answer limit (the context's room left)
    assert made > 10 and all(c.answer_tokens == made and c.finish_reason == "length" for c in answer.candidates)
    tokens = answer.stats.prompt_tokens + made
    assert tokens > 0.85 * engine.context
    one_row = planned_bytes(engine.model.config, kv, 1, tokens)
    assert n * one_row * 0.5 < most <= planned_bytes(engine.model.config, kv, n, tokens)


def test_parallel_answers_that_would_not_fit_are_refused_before_the_rows_are_made(monkeypatch):
    """Eight rows of a nearly full context are eight copies of its KV cache: with memory free for two, the request
    is refused with a clear error saying how many would fit, before the one-row prefill is repeated into rows."""
    engine = Engine(make_model(448), make_tokenizer(), model_id="tiny", context=512, kv="int8")
    question = long_question(engine, 440)
    config = engine.model.config
    repeated = []
    for cls in (PonderCache, PonderDynamicCache):
        original = cls.batch_repeat_interleave
        monkeypatch.setattr(cls, "batch_repeat_interleave",
                            lambda self, n, original=original: (repeated.append(n), original(self, n))[1])
    # a row takes between its prompt's tokens and the whole context: room for 2.5 of the largest is 2 rows
    largest = planned_bytes(config, "int8", 1, engine.context)
    fake_free_memory(monkeypatch, int(2.5 * largest / FREE_SHARE))
    with pytest.raises(RequestTooLarge, match=r"8 parallel answers .* MiB .* ask for 2 at most"):
        next(engine.parallel(question, SAMPLE, n=8, mode="base"))
    assert repeated == []
    fake_free_memory(monkeypatch, int(8.5 * largest / FREE_SHARE))
    events = list(engine.parallel(question, SAMPLE, n=8, mode="base"))
    assert isinstance(events[-1], DoneEvent) and len(events[-1].answer.candidates) == 8 and repeated == [8]
    fake_free_memory(monkeypatch, largest // 2)
    with pytest.raises(RequestTooLarge, match="shorter conversation"):
        next(engine.parallel(question, SAMPLE, n=2, mode="base"))
