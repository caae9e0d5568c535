"""EngineService on the real tiny engine: signals, cancel, errors; the Qt loop keeps running meanwhile."""
import asyncio

from PySide6.QtWidgets import QApplication

from app.engine_service import EngineService
from core.config import SamplingConfig


def test_ask_streams_tokens_and_finishes(loop, tiny_engine):
    service = EngineService(engine=tiny_engine)
    tokens, finished = [], []
    service.tokenReceived.connect(tokens.append)
    service.answerFinished.connect(finished.append)

    async def go():
        assert await service.start()
        return await service.ask("hello", SamplingConfig(temperature=0, max_tokens=10, ignore_eos=True))

    answer = loop.run_until_complete(go())
    assert answer.stats.completion_tokens == 10 and finished == [answer]
    assert "".join(t.text for t in tokens) == answer.text
    service.shutdown()


def test_cancel_stops_within_a_step(loop, tiny_engine):
    service = EngineService(engine=tiny_engine)

    async def go():
        await service.start()
        task = asyncio.ensure_future(service.ask("hello", SamplingConfig(temperature=0, max_tokens=5000,
                                                                          ignore_eos=True)))
        await asyncio.sleep(0.2)
        service.cancel()
        return await task

    answer = loop.run_until_complete(go())
    assert answer.finish_reason == "cancelled" and answer.stats.completion_tokens < 5000
    service.shutdown()


def test_load_failure_reported_not_raised(loop, store):
    service = EngineService(store=store)
    service.config = service.config.__class__(model_id="qwen2.5-7b-instruct")  # not installed, no wheels
    errors = []
    service.failed.connect(errors.append)
    ok = loop.run_until_complete(service.start())
    assert ok is False and errors and "not" in errors[0]
    assert QApplication.instance() is not None
    service.shutdown()


def test_a_skipped_damaged_adapter_reaches_the_user(loop, tiny_store):
    from core.adapters import lora as adapters
    from core.config import EngineConfig
    from tests.conftest import TINY_ID
    from tests.tiny import make_model

    folder = tiny_store.get(TINY_ID).folder / "components" / "reasoning"
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), folder, {"name": "mine"})
    (folder / "adapter_model.safetensors").write_bytes(b"not safetensors")
    service = EngineService(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16"), store=tiny_store)
    warned = []
    service.warned.connect(warned.append)
    assert loop.run_until_complete(service.start())
    assert not service.can_reason and len(warned) == 1 and "damaged" in warned[0]
    service.shutdown()
