"""The window drives the real tiny engine through EngineService: send, stream, stop."""
import asyncio

import pytest
import qasync

from app.engine_service import EngineService
from ui.main_window import MainWindow


@pytest.fixture
def loop(qapp):
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)


def run_until(loop, predicate, timeout=30.0):
    async def wait():
        for _ in range(int(timeout / 0.02)):
            if predicate():
                return True
            await asyncio.sleep(0.02)
        return False

    return loop.run_until_complete(wait())


def test_send_streams_answer_into_transcript(qtbot, loop, tiny_engine):
    service = EngineService(engine=tiny_engine)
    window = MainWindow(service)
    qtbot.addWidget(window)
    loop.run_until_complete(service.start())
    assert window.send_button.isEnabled() and "Ready" in window.status.text()
    window.composer.setPlainText("What is 17*23?")
    window.send_button.click()
    assert run_until(loop, lambda: len(window.messages) == 2)
    assert window.messages[0] == {"role": "user", "content": "What is 17*23?"}
    assert "tok/s" in window.status.text()
    assert window.messages[1]["content"][:5] in window.transcript.toPlainText()
    service.shutdown()


def test_stop_button_cancels(qtbot, loop, tiny_engine):
    from core.config import SamplingConfig

    service = EngineService(engine=tiny_engine)
    window = MainWindow(service)
    qtbot.addWidget(window)
    loop.run_until_complete(service.start())
    task = asyncio.ensure_future(service.ask("hi", SamplingConfig(temperature=0, max_tokens=5000, ignore_eos=True)))
    assert run_until(loop, lambda: window.stop_button.isEnabled())
    window.stop_button.click()
    loop.run_until_complete(task)
    assert task.result().finish_reason == "cancelled"
    assert not window.stop_button.isEnabled()
    service.shutdown()
