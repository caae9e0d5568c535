"""The window's shell on real widgets (offscreen), a scripted engine and a real chat store: text size shortcuts,
Enter-to-send, the growing composer, the sidebar's groups / pins / elision, the welcome panel, and the themes'
stylesheets (no white rules in the dark one)."""
import re
import time
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QKeySequence, QPalette
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.settings import load_settings
from core.storage.chats import ChatStore
from tests.qt_helpers import run_until
from tests.ui.helpers import ask, make_window, wait_idle
from tests.ui.scripted_engine import ScriptedEngine
from ui.composer import MAX_LINES, Composer
from ui.sidebar import Sidebar, date_group
from ui.theme import apply_theme, stylesheet

DAY = 86400.0


def shown(qtbot, widget, width: int, height: int):
    """`widget` at that size, shown and exposed offscreen."""
    qtbot.addWidget(widget)
    widget.resize(width, height)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


@pytest.fixture
def window(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    yield win
    win.close()
    win.service.shutdown()


@pytest.fixture
def themed(qapp):
    """Restores the application's look after a test that applies a theme."""
    palette, sheet = qapp.palette(), qapp.styleSheet()
    yield qapp
    qapp.setStyleSheet(sheet)
    qapp.setPalette(palette)
    qapp.setProperty("ponder_mode", None)
    qapp.setProperty("ponder_theme", None)


# --- text size -----------------------------------------------------------------------------------------
def test_text_size_shortcuts_scale_transcript_and_composer_and_persist(window, qtbot, tmp_path):
    window.show()
    window.windowHandle().requestActivate()  # shortcuts fire in the active window only
    assert QTest.qWaitForWindowActive(window.windowHandle(), 5000)
    window.composer.input.setFocus()
    base = window.settings.font_size
    assert window.view.font().pointSize() == base and window.composer.input.font().pointSize() == base
    assert QKeySequence("Ctrl+=") in window.bigger_action.shortcuts()
    assert window.smaller_action.shortcut() == QKeySequence("Ctrl+-")
    assert window.reset_size_action.shortcut() == QKeySequence("Ctrl+0")
    QTest.keyClick(window.composer.input, Qt.Key.Key_Equal, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClick(window.composer.input, Qt.Key.Key_Equal, Qt.KeyboardModifier.ControlModifier)
    assert window.view.font().pointSize() == base + 2 and window.composer.input.font().pointSize() == base + 2
    assert load_settings(ChatStore(tmp_path / "chats.db")).font_size == base + 2
    QTest.keyClick(window.composer.input, Qt.Key.Key_Minus, Qt.KeyboardModifier.ControlModifier)
    assert window.view.font().pointSize() == base + 1
    QTest.keyClick(window.composer.input, Qt.Key.Key_0, Qt.KeyboardModifier.ControlModifier)
    assert window.view.font().pointSize() == base and load_settings(ChatStore(tmp_path / "chats.db")).font_size == base


def test_text_size_is_restored_and_clamped(qtbot, loop, tmp_path):
    first = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    first.apply_settings(replace(first.settings, font_size=31))
    first.zoom(1)
    first.zoom(1)
    assert first.settings.font_size == 32  # the largest size
    first.close()
    first.service.shutdown()
    again = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    assert again.view.font().pointSize() == 32 and again.composer.input.font().pointSize() == 32
    again.service.shutdown()


# --- Enter to send ---------------------------------------------------------------------------------------
def test_enter_sends_when_on_and_shift_enter_is_a_new_line(window, loop):
    window.apply_settings(replace(window.settings, enter_sends=True))
    box = window.composer.input
    assert "Enter to send" in box.placeholderText()
    QTest.keyClicks(box, "first line")
    QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(box, "second line")
    assert box.toPlainText() == "first line\nsecond line" and not window.controller.messages()
    QTest.keyClick(box, Qt.Key.Key_Return)
    wait_idle(window, loop)
    msgs = window.controller.messages()
    assert msgs[0].role == "user" and msgs[0].content == "first line\nsecond line" and box.toPlainText() == ""


def test_enter_is_a_new_line_when_off_and_ctrl_enter_always_sends(window, loop):
    assert not window.settings.enter_sends
    box = window.composer.input
    QTest.keyClicks(box, "one")
    QTest.keyClick(box, Qt.Key.Key_Return)
    QTest.keyClicks(box, "two")
    assert box.toPlainText() == "one\ntwo" and not window.controller.messages()
    QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    wait_idle(window, loop)
    assert window.controller.messages()[0].content == "one\ntwo"
    window.apply_settings(replace(window.settings, enter_sends=True))
    QTest.keyClicks(box, "three")
    QTest.keyClick(box, Qt.Key.Key_Enter, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.KeypadModifier)
    wait_idle(window, loop)
    assert [m.content for m in window.controller.messages() if m.role == "user"] == ["one\ntwo", "three"]


def test_the_composer_grows_with_its_lines_up_to_a_cap(qtbot):
    composer = shown(qtbot, Composer(), 600, 300)
    box = composer.input
    one = box.height()
    box.setPlainText("a\nb\nc")
    assert run_qt(lambda: box.height() > one) and box.lines() == 3
    three = box.height()
    box.setPlainText("\n".join(f"line {i}" for i in range(30)))
    assert run_qt(lambda: box.height() > three)
    capped = box.height()
    assert box.lines() == 30 and box.verticalScrollBar().maximum() > 0  # the rest scrolls
    box.setPlainText("\n".join(f"line {i}" for i in range(MAX_LINES)))
    assert run_qt(lambda: box.height() == capped)  # 8 lines is the cap
    box.setPlainText("word " * 400)  # one paragraph, wrapped: grows too
    assert run_qt(lambda: box.height() == capped) and box.lines() > MAX_LINES
    box.clear()
    assert run_qt(lambda: box.height() == one)


def run_qt(predicate, timeout=2.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        QApplication.processEvents()
        if predicate():
            return True
    return False


# --- sidebar ---------------------------------------------------------------------------------------------
def test_sidebar_groups_by_date_pinned_first(qtbot):
    now = time.mktime((2026, 11, 30, 15, 0, 0, 0, 0, -1))
    chats = [{"id": "a", "title": "Last month", "updated": now - 30 * DAY},
             {"id": "b", "title": "This morning", "updated": now - 3600},
             {"id": "c", "title": "Yesterday's", "updated": now - DAY},
             {"id": "d", "title": "Pinned old", "updated": now - 90 * DAY, "pinned": 1},
             {"id": "e", "title": "Three days ago", "updated": now - 3 * DAY},
             {"id": "f", "title": "Just now", "updated": now - 60}]
    bar = Sidebar()
    qtbot.addWidget(bar)
    bar.show_conversations(chats, "c", now=now)
    assert bar.groups() == [("Pinned", ["Pinned old"]), ("Today", ["Just now", "This morning"]),
                            ("Yesterday", ["Yesterday's"]), ("Previous 7 days", ["Three days ago"]),
                            ("Older", ["Last month"])]
    assert bar.list.count() == 6 and bar.list.currentItem().text() == "Yesterday's"
    assert date_group(now - 8 * DAY, now) == "Older" and date_group(now, now) == "Today"


def test_sidebar_elides_long_titles_without_a_horizontal_scrollbar(qtbot):
    bar = shown(qtbot, Sidebar(), 220, 400)
    long = "A very long question about the airspeed velocity of an unladen swallow, African or European " * 3
    bar.show_conversations([{"id": "x", "title": long, "updated": time.time()}], None)
    lst = bar.list
    assert lst.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    assert lst.textElideMode() == Qt.TextElideMode.ElideRight and not lst.wordWrap()
    assert not lst.horizontalScrollBar().isVisible()
    assert lst.visualItemRect(lst.item(0)).right() <= lst.viewport().width()
    assert lst.item(0).toolTip() == long  # the whole title on hover


def test_a_chat_opens_from_the_keyboard_and_once_per_click(qtbot):
    bar = Sidebar()
    qtbot.addWidget(bar)
    bar.show()
    qtbot.waitExposed(bar)
    now = time.time()
    bar.show_conversations([{"id": "a", "title": "First", "updated": now},
                            {"id": "b", "title": "Second", "updated": now - 60}], "a")
    opened = []
    bar.selected.connect(opened.append)
    lst = bar.list
    lst.setFocus()
    QTest.keyClick(lst, Qt.Key.Key_Down)  # the highlight moves; nothing opens yet
    assert lst.currentItem().text() == "Second" and opened == []
    QTest.keyClick(lst, Qt.Key.Key_Return)
    assert opened == ["b"]
    QTest.keyClick(lst, Qt.Key.Key_Up)
    QTest.keyClick(lst, Qt.Key.Key_Enter)
    assert opened == ["b", "a"]
    opened.clear()
    QTest.mouseClick(lst.viewport(), Qt.MouseButton.LeftButton, pos=lst.visualItemRect(lst.item(1)).center())
    assert opened == ["b"]
    QTest.qWait(QApplication.doubleClickInterval() + 50)
    opened.clear()
    first = lst.visualItemRect(lst.item(0)).center()
    with qtbot.waitSignal(lst.itemActivated):  # a double click: a click, then the second press activates
        QTest.mouseClick(lst.viewport(), Qt.MouseButton.LeftButton, pos=first)
        QTest.mouseDClick(lst.viewport(), Qt.MouseButton.LeftButton, pos=first)
    assert opened == ["a"]  # it opens once


def test_the_chat_list_keeps_its_place_when_a_chat_changes(qtbot):
    """A rebuild (a reply finished in the open chat) keeps the scroll position and the highlighted row."""
    bar = shown(qtbot, Sidebar(), 240, 300)
    now = time.time()
    chats = [{"id": f"c{i}", "title": f"Chat {i}", "updated": now - i * 60} for i in range(80)]
    bar.show_conversations(chats, "c0")
    scroll = bar.list.verticalScrollBar()
    scroll.setValue(scroll.maximum() // 2)
    bar.list.setCurrentRow(40)  # the keyboard highlight moved there
    where = scroll.value()
    assert where > 0
    chats[0]["updated"] = now + 1
    bar.show_conversations(chats, "c0")
    QApplication.processEvents()
    assert scroll.value() == where and bar.list.currentItem().text() == "Chat 40"
    bar.show_conversations(chats, "c70")  # another chat opened: it is highlighted and shown
    QApplication.processEvents()
    assert bar.list.currentItem().text() == "Chat 70"
    assert bar.list.viewport().rect().intersects(bar.list.visualItemRect(bar.list.currentItem()))


def test_esc_and_ctrl_enter_in_other_fields_do_their_own_thing(qtbot, loop, tmp_path):
    """Esc in the search box clears it and Ctrl+Enter in the title editor renames: neither stops the answer nor
    sends the composer's text; Esc elsewhere still stops."""
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(delay_s=0.3))
    win.show()
    win.windowHandle().requestActivate()
    assert QTest.qWaitForWindowActive(win.windowHandle(), 5000)
    win.composer.apply("base", 8, 1)
    win.composer.input.setPlainText("First")
    win.composer.send_button.click()
    assert run_until(loop, lambda: win.service.busy, 10)
    search = win.sidebar.search
    search.setFocus()
    QTest.keyClicks(search, "zzz")
    QTest.keyClick(search, Qt.Key.Key_Escape)
    assert search.text() == "" and win.service.busy and not win.service.stop_requested
    wait_idle(win, loop)
    cid = win.controller.current
    win.composer.input.setPlainText("Not yet")
    win.header.start_rename()
    win.header.title_edit.setText("Renamed")
    QTest.keyClick(win.header.title_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert win.controller.title(cid) == "Renamed" and win.composer.input.toPlainText() == "Not yet"
    assert len(win.controller.messages()) == 2
    win.composer.input.setPlainText("Second")
    win.composer.send_button.click()
    assert run_until(loop, lambda: win.service.busy, 10)
    win.view.setFocus()
    QTest.keyClick(win.view, Qt.Key.Key_Escape)  # Stop, from outside any text field
    assert win.service.stop_requested
    wait_idle(win, loop)
    win.close()
    win.service.shutdown()


def test_formulas_follow_the_text_size_in_the_window(window, loop):
    """Zooming redraws the formulas of the answers already shown (and new ones) at the new size."""
    reply = ask(window, loop, "Q", "base")
    window.controller.store.update_message(reply.id, content="So $x^2$ it is.")
    window.render()

    def height():
        (img,) = window.view.card(reply.id).content.images.values()
        return img.deviceIndependentSize().height()

    before = height()
    for _ in range(8):
        window.zoom(1)
    assert height() > 1.4 * before


def test_pinning_from_the_context_menu_moves_the_chat_on_top(window, loop):
    for question in ("first question", "second question", "third question"):
        window.new_chat()
        window.composer.input.setPlainText(question)
        window.composer.send_button.click()
        wait_idle(window, loop)
    titles = [window.sidebar.list.item(i).text() for i in range(3)]
    assert titles == ["third question", "second question", "first question"]
    item = window.sidebar.list.item(2)
    menu = window.sidebar.context_menu(item)
    pin = next(a for a in menu.actions() if a.text() == "Pin to top")
    pin.trigger()
    assert window.sidebar.groups()[0] == ("Pinned", ["first question"])
    assert window.sidebar.groups()[1] == ("Today", ["third question", "second question"])
    menu = window.sidebar.context_menu(window.sidebar.list.item(0))
    assert [a.text() for a in menu.actions()][0] == "Unpin"
    next(a for a in menu.actions() if a.text() == "Unpin").trigger()
    assert [g for g, _ in window.sidebar.groups()] == ["Today"]


# --- welcome panel ---------------------------------------------------------------------------------------
def test_welcome_shows_for_an_empty_chat_and_hides_after_sending(window, loop, qtbot):
    assert window.stack.currentWidget() is window.welcome
    assert "runs on this computer" in window.welcome.offline.text()
    modes = {card.mode for card in window.welcome.cards}
    assert modes == {"auto", "reason", "base"}
    card = next(c for c in window.welcome.cards if c.mode == "reason")
    window.composer.apply("base", 8, 1)
    qtbot.mouseClick(card, Qt.MouseButton.LeftButton)
    assert window.composer.input.toPlainText() == card.prompt
    assert window.composer.options()["mode"] == "reason"
    fast = next(c for c in window.welcome.cards if c.mode == "base")
    QTest.keyClick(fast, Qt.Key.Key_Space)
    assert window.composer.input.toPlainText() == fast.prompt and window.composer.options()["mode"] == "base"
    window.composer.send_button.click()
    wait_idle(window, loop)
    assert window.stack.currentWidget() is window.view and len(window.controller.messages()) == 2
    window.new_chat()
    assert window.stack.currentWidget() is window.welcome
    window.controller.open(window.controller.conversations()[0]["id"])
    assert window.stack.currentWidget() is window.view


def test_a_reasoning_example_on_a_model_that_cannot_reason_stays_fast(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(can_reason=False))
    card = next(c for c in win.welcome.cards if c.mode == "reason")
    qtbot.mouseClick(card, Qt.MouseButton.LeftButton)
    assert win.composer.input.toPlainText() == card.prompt and win.composer.options()["mode"] == "base"
    assert "Fast mode" in win.status.text()
    win.service.shutdown()


# --- themes ----------------------------------------------------------------------------------------------
COLOUR = re.compile(r"#[0-9a-fA-F]{6}\b|\bwhite\b|\bblack\b")


def border_colours(sheet: str) -> list[QColor]:
    """Every colour used by a border / rule in the stylesheet (border*, QSplitter::handle and separators)."""
    out = []
    for selector, body in re.findall(r"([^{}]+)\{([^{}]*)\}", sheet):
        for prop, value in re.findall(r"([\w-]+)\s*:\s*([^;]+);", body):
            if "-arrow" in selector:  # arrow glyphs drawn with borders, not rules
                continue
            rule = prop.startswith("border") or (prop.startswith("background") and (
                "::handle" in selector and "QSplitter" in selector or "::separator" in selector))
            if rule:
                out += [QColor(c) for c in COLOUR.findall(value)]
    return out


def test_dark_theme_has_no_white_rules(themed):
    assert apply_theme("dark", themed) == "dark"
    sheet = themed.styleSheet()
    assert sheet == stylesheet("dark") and "border" in sheet
    colours = border_colours(sheet)
    light = [c.name() for c in colours if c.lightness() >= 128 and c.hslSaturation() < 100]  # the accent is blue
    assert colours and not light, light
    assert not re.search(r"#f[0-9a-f]{5}\b|#e[0-9a-f]{5}\b|white", sheet.split("color:")[0])
    palette = themed.palette()
    for role in (QPalette.ColorRole.Light, QPalette.ColorRole.Midlight, QPalette.ColorRole.Mid,
                 QPalette.ColorRole.Window, QPalette.ColorRole.Base, QPalette.ColorRole.Button):
        assert palette.color(role).lightness() < 100, role  # Fusion draws frames and rules with these
    assert palette.color(QPalette.ColorRole.Text).lightness() > 200


def test_light_theme_rules_are_soft_not_black(themed):
    assert apply_theme("light", themed) == "light"
    colours = border_colours(themed.styleSheet())
    assert colours and all(c.lightness() > 100 for c in colours)
    assert themed.palette().color(QPalette.ColorRole.Window).lightness() > 160
    assert "border-radius" in themed.styleSheet()


# --- settings --------------------------------------------------------------------------------------------
def test_text_size_and_enter_sends_in_the_settings_dialog(qtbot, tmp_path):
    from app.settings import AppSettings, from_dict
    from ui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(AppSettings(model_id="m", font_size=14, enter_sends=True), tmp_path)
    qtbot.addWidget(dialog)
    assert dialog.font_size.value() == 14 and dialog.enter_sends.isChecked()
    dialog.font_size.setValue(99)  # clamped to the largest size
    dialog.enter_sends.setChecked(False)
    got = dialog.settings()
    assert (got.font_size, got.enter_sends) == (32, False)
    assert from_dict({"font_size": 3, "enter_sends": "yes"}) == AppSettings()  # bad stored values: defaults
    assert from_dict({"font_size": 18, "enter_sends": True}).font_size == 18
