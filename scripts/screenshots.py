"""Screenshots of the real app on the embedded model (run under Xvfb, or offscreen), light and dark, and a GIF
of a reasoning answer streaming. Writes docs/*.png and docs/reasoning-stream.gif.

    xvfb-run -a -s "-screen 0 1280x900x24" .venv/bin/python scripts/screenshots.py

Scenes: the welcome panel, a fast answer with code, a reasoning answer with its thinking card (recorded as a
GIF while it streams), an answer with math, four parallel answers with the vote chart, a regenerated answer
with its ‹ 2/2 › branch control, the models, adapters and settings dialogs, and the dark theme.
"""
from __future__ import annotations

import asyncio
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs"
GIF_WIDTH = 900
GIF_FRAME_S = 0.25


def pil_image(widget, width: int):
    """A widget's pixels as a PIL image `width` wide (for the GIF)."""
    from PIL import Image
    from PySide6.QtCore import QBuffer, QIODevice

    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    widget.grab().save(buf, "PNG")
    image = Image.open(io.BytesIO(bytes(buf.data()))).convert("RGB")
    return image.resize((width, round(image.height * width / image.width)))


async def record(window, task: asyncio.Task, path: Path) -> int:
    """Frames of `window` every GIF_FRAME_S until `task` is done, saved as an optimised looping GIF."""
    frames = []
    while not task.done():
        frames.append(pil_image(window, GIF_WIDTH))
        await asyncio.sleep(GIF_FRAME_S)
    await task
    await asyncio.sleep(0.3)
    frames += [pil_image(window, GIF_WIDTH)] * 8  # hold the finished answer
    palette = [f.quantize(colors=128) for f in frames]
    palette[0].save(path, save_all=True, append_images=palette[1:], duration=int(GIF_FRAME_S * 1000), loop=0,
                    optimize=True)
    return len(frames)


def main() -> int:
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.chat_controller import ChatController, ReplyOptions
    from app.engine_service import EngineService
    from app.model_service import ModelService
    from core.config import EngineConfig
    from core.storage import paths
    from core.storage.chats import ChatStore
    from ui.main_window import MainWindow
    from ui.settings_dialog import SettingsDialog
    from ui.theme import apply_theme

    app = QApplication.instance() or QApplication(sys.argv)
    apply_theme("light", app)
    store = ChatStore(Path(tempfile.mkdtemp()) / "chats.db")
    service = EngineService(EngineConfig())
    controller = ChatController(service, store)
    window = MainWindow(service, controller, ModelService())
    window.resize(1240, 860)
    window.show()

    async def settle(seconds: float = 0.4):
        window.render()
        await asyncio.sleep(seconds)

    async def shot(name: str, widget=None):
        await settle()
        (widget or window).grab().save(str(OUT / f"{name}.png"))
        print("saved", name, flush=True)

    async def ask(text: str, mode: str, *, budget: int = 256, parallel: int = 1, temperature: float = 0.2):
        window.composer.apply(mode, budget, parallel)
        await controller.send(text, ReplyOptions(mode=mode, budget=budget, parallel=parallel, temperature=temperature,
                                                 answer_max_tokens=320))

    async def scenario():
        await service.start()
        window.new_chat()
        await shot("welcome")
        await ask("Write a Python function that keeps the items of a list that are < 10 and > 2, with a short "
                  "example.", "base")
        await shot("code-answer")
        window.new_chat()
        window.composer.apply("reason", 256, 1)
        started = time.monotonic()
        task = asyncio.ensure_future(ask("A shop sells pens at $3 each. Tom buys 4 pens and pays with a $20 bill. "
                                         "How much change does he get?", "reason"))
        frames = await record(window, task, OUT / "reasoning-stream.gif")
        print(f"gif: {frames} frames over {time.monotonic() - started:.0f} s", flush=True)
        window.view.expanded.add(controller.messages()[-1].id)
        await shot("reasoning-answer")
        window.new_chat()
        await ask("Solve x^2 - 5x + 6 = 0. Show the steps with LaTeX and give the roots in \\boxed{}.", "base")
        await shot("math-answer")
        window.new_chat()
        await ask("What is 15% of 80?", "reason", parallel=4, temperature=0.7)
        await shot("parallel-vote")
        await controller.regenerate(ReplyOptions(mode="reason", budget=256, parallel=4, temperature=0.7,
                                                 answer_max_tokens=320))
        await shot("branches")
        window.open_models()
        window.model_manager.select(service.model_name)
        await shot("model-manager", window.model_manager)
        window.model_manager.close()
        window.open_adapters()
        await shot("adapters", window.adapters_dialog)
        window.adapters_dialog.close()
        dialog = SettingsDialog(window.settings, paths.data_dir(), window)
        dialog.show()
        await shot("settings", dialog)
        dialog.close()
        apply_theme("dark")
        await shot("dark-theme")
        math_chat = next(c for c in controller.conversations() if "x^2" in c["title"])
        window.sidebar.selected.emit(math_chat["id"])  # as a click in the sidebar
        await shot("dark-math")
        app.quit()

    qasync.run(scenario())
    service.shutdown()
    print("saved", *sorted(p.name for p in OUT.glob("*.*") if p.suffix in (".png", ".gif")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
