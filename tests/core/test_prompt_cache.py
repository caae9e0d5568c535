"""Prompt caching (core.decode.prompt_cache): a prompt that starts like a recent one prefills only the rest, with
the same next-token logits and switcher states as a full prefill; decoding never touches what is kept."""
import torch

from core.config import SamplingConfig
from core.decode.cache import new_cache
from core.decode.prompt_cache import PromptCache
from core.engine import Engine, collect
from tests.core.test_fused_decode import w4_engine
from tests.tiny import make_model, make_tokenizer

GREEDY = SamplingConfig(temperature=0, max_tokens=30, ignore_eos=True, repetition_penalty=1.0)


def bf16_engine() -> Engine:
    torch.manual_seed(0)
    return Engine(make_model(448, hidden_size=256), make_tokenizer(), model_id="tiny", context=512,
                  prompt_cache=PromptCache(min_tokens=4))


def question(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def prefill(engine, ids, mode="base", reuse=False):
    cache = new_cache(engine.model.config, engine.kv)
    logits, decision = engine.open_prompt(ids, mode, cache, reuse=reuse)
    return logits.float(), decision, cache


def test_a_shared_prefix_is_reused_with_the_logits_of_a_full_prefill():
    engine = bf16_engine()
    first = engine.prompt_ids(question("What is 17*23? Tell me"))
    second = engine.prompt_ids(question("What is 17*23? Say"))
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    full, _, full_cache = prefill(engine, second)
    prefill(engine, first, reuse=True)
    assert engine.prompt_cache.hits == 0
    for mode in ("base", "reason"):
        part, _, cache = prefill(engine, second, mode, reuse=True)
        assert cache.get_seq_length() == len(second) + (0 if mode == "base" else len(engine.markers.think_open))
        if mode == "base":
            torch.testing.assert_close(part, full, atol=1e-2, rtol=0)
    assert engine.prompt_cache.hits == 2 and engine.prompt_cache.reused_tokens >= 2 * common
    assert full_cache.get_seq_length() == len(second)


def test_auto_mode_gets_the_whole_prompts_states_for_the_switcher():
    engine = bf16_engine()
    seen = []
    engine.route = lambda mode, hidden: seen.append(hidden) or Engine.route(engine, "base", hidden)
    ids = engine.prompt_ids(question("Why is the sky blue?"))
    prefill(engine, ids, "auto")
    prefill(engine, ids, "auto", reuse=True)  # kept, no reuse yet
    prefill(engine, ids, "auto", reuse=True)  # reuses all but the last token
    assert engine.prompt_cache.reused_tokens == len(ids) - 1
    assert seen[2].shape == seen[0].shape == (1, len(ids), 256)
    torch.testing.assert_close(seen[2].float(), seen[0].float(), atol=2e-2, rtol=0)


def test_decoding_never_changes_a_kept_prompt():
    """A long answer appends to its request's cache; the next request with the same prompt still starts from the
    prompt alone (int8 cache, packed int4 weights, the fused step)."""
    engine = w4_engine()
    engine.prompt_cache = PromptCache(min_tokens=4)
    ids = engine.prompt_ids(question("Name a prime number."))
    cold, _, _ = prefill(engine, ids)
    long = SamplingConfig(temperature=0, max_tokens=120, ignore_eos=True, repetition_penalty=1.0)
    collect(engine.stream(question("Name a prime number."), long))
    warm, _, cache = prefill(engine, ids, reuse=True)
    assert engine.prompt_cache.reused_tokens == len(ids) - 1 and cache.get_seq_length() == len(ids)
    assert torch.equal(warm.argmax(-1), cold.argmax(-1))
    torch.testing.assert_close(warm, cold, atol=0.1, rtol=0)  # one row through the int4 kernel vs a whole prompt


def test_answers_from_a_reused_prefix_read_like_cold_ones():
    engine = bf16_engine()
    cold = engine.generate("What is 2+2?", GREEDY)
    engine.prompt_cache.clear()
    engine.generate("What is 3+3?", GREEDY)  # keeps the template and system prompt
    warm = engine.generate("What is 2+2?", GREEDY)
    assert engine.prompt_cache.hits == 1 and warm.stats.completion_tokens == cold.stats.completion_tokens == 30
    assert warm.token_ids[:4] == cold.token_ids[:4]  # greedy on equal logits (up to rounding: other CPUs)


def test_the_cache_keeps_at_most_its_token_budget_least_recent_first():
    engine = bf16_engine()
    engine.prompt_cache = store = PromptCache(max_tokens=100, min_tokens=4)
    prompts = [engine.prompt_ids(question(q)) for q in ("one", "two two", "three three three")]
    for ids in prompts:
        prefill(engine, ids, reuse=True)
        assert store.tokens <= 100
    kept = [list(e.ids) for e in store._entries]
    assert kept[-1] == prompts[-1] and prompts[0] not in kept


def test_off_for_griffin_which_scores_the_whole_prompt():
    engine = bf16_engine()
    engine.sparse_plan = lambda: object()  # any plan: the prompt must be prefilled whole
    engine._scoring = lambda cache, mask=None: torch.inference_mode()
    ids = engine.prompt_ids(question("hello there"))
    prefill(engine, ids, reuse=True)
    prefill(engine, ids, reuse=True)
    assert engine.prompt_cache.hits == 0 and engine.prompt_cache.tokens == 0
