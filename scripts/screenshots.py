"""Screenshots of the real app on the embedded model (run under Xvfb, or offscreen):
a fast answer, a reasoning answer with its trace, a 4-way parallel answer with the vote, the model manager,
the settings dialog and the dark theme. Writes docs/*.png.

    xvfb-run -a -s "-screen 0 1280x900x24" .venv/bin/python scripts/screenshots.py
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.chat_controller import ChatController, ReplyOptions
    from app.engine_service import EngineService
    from core import paths
    from core.config import EngineConfig
    from core.store import ChatStore
    from ui.main_window import MainWindow
    from ui.settings_dialog import SettingsDialog
    from ui.theme import apply_theme

    app = QApplication.instance() or QApplication(sys.argv)
    apply_theme("light", app)
    store = ChatStore(Path(tempfile.mkdtemp()) / "chats.db")
    service = EngineService(EngineConfig())
    controller = ChatController(service, store)
    window = MainWindow(service, controller)
    window.resize(1200, 820)
    window.show()
    out = ROOT / "docs"

    async def scenario():
        await service.start()
        window.composer.apply("base", 256, 1)
        await controller.send("Write a one-line Python expression that reverses a string s.", ReplyOptions(
            mode="base", temperature=0.2))
        await asyncio.sleep(0.3)
        window.grab().save(str(out / "fast-answer.png"))
        controller.new_chat()
        window.composer.apply("reason", 256, 1)
        await controller.send("A shop sells pens at $3 each. Tom buys 4 pens and pays with a $20 bill. "
                              "How much change does he get?", ReplyOptions(mode="reason", budget=256, temperature=0.2))
        last = controller.messages()[-1]
        window.view.expanded.add(last.id)
        window.render()
        await asyncio.sleep(0.3)
        window.grab().save(str(out / "reasoning-answer.png"))
        controller.new_chat()
        window.composer.apply("reason", 256, 4)
        await controller.send("What is 15% of 80?", ReplyOptions(mode="reason", budget=256, parallel=4, temperature=0.7))
        await asyncio.sleep(0.3)
        window.grab().save(str(out / "parallel-vote.png"))
        window.open_models()
        window.model_manager.select(service.model_name)
        await asyncio.sleep(0.3)
        window.model_manager.grab().save(str(out / "model-manager.png"))
        window.model_manager.close()
        dialog = SettingsDialog(window.settings, paths.data_dir(), window)
        dialog.show()
        await asyncio.sleep(0.3)
        dialog.grab().save(str(out / "settings.png"))
        dialog.close()
        apply_theme("dark")
        window.render()
        await asyncio.sleep(0.3)
        window.grab().save(str(out / "dark-theme.png"))
        app.quit()

    qasync.run(scenario())
    service.shutdown()
    print("saved", *sorted(p.name for p in out.glob("*.png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
