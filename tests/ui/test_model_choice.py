"""First launch: the window remembers the model chosen for this machine and says which one and why."""
from app.chat_controller import ChatController
from app.engine_service import EngineService
from app.model_service import ModelService
from core.config import EngineConfig
from core.machine_fit import ModelChoice
from core.storage.chats import ChatStore
from tests.conftest import TINY_ID
from ui.main_window import MainWindow


def test_first_launch_choice_is_loaded_remembered_and_explained(qtbot, loop, tiny_store, tmp_path):
    asked = []

    def choose():
        asked.append(1)
        return ModelChoice(TINY_ID, "Tiny: it decodes fast here (measured).", 50.0, 16 * 2**30)

    service = EngineService(EngineConfig(model_id="qwen2.5-coder-0.5b-instruct", precision="bf16"), store=tiny_store,
                            choose=choose)
    chats = ChatStore(tmp_path / "chats.db")
    win = MainWindow(service, ChatController(service, chats), ModelService(store=tiny_store))
    qtbot.addWidget(win)
    assert loop.run_until_complete(service.start()) is True
    loop.run_until_complete(__import__("asyncio").sleep(0.05))  # the posted signal reaches the window
    assert service.model_name == TINY_ID and asked == [1]
    assert ChatController(service, chats).load_settings().model_id == TINY_ID  # remembered
    assert "Chosen for this computer: Tiny" in win.status.text() and "Ready" in win.status.text()
    assert win.model_service.active_id == TINY_ID
    assert loop.run_until_complete(service.switch_model(TINY_ID)) is True and asked == [1]  # asked once only
    service.shutdown()


def test_the_progress_bar_says_the_time_left_at_the_stage_rate():
    from ui.main_window import eta

    assert eta(0.5, 1, 10) == ""  # nothing measured yet
    assert eta(10.0, 5, 5) == " — about 10 s left"
    assert eta(60.0, 2, 8) == " — about 4 min left"
    assert eta(10.0, 5, 0) == ""


def test_a_failed_measurement_keeps_the_configured_model(qtbot, loop, tiny_store, tmp_path):
    def choose():
        raise RuntimeError("no timer")

    service = EngineService(EngineConfig(model_id=TINY_ID, precision="bf16"), store=tiny_store, choose=choose)
    win = MainWindow(service, ChatController(service, ChatStore(tmp_path / "chats.db")), ModelService(store=tiny_store))
    qtbot.addWidget(win)
    assert loop.run_until_complete(service.start()) is True
    assert service.model_name == TINY_ID and win.chosen_note == ""
    service.shutdown()
