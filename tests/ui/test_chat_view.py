"""The transcript's cards on real widgets (offscreen): streaming touches only the live card (a selection in an
earlier card, the scroll position and the other cards' documents survive), Markdown/code/math through the card,
hover buttons with accessible names emitting their verbs, ‹ n/m ›, the error card, rows per parallel stream; and
the window streaming a long answer from the scripted engine while the user has text selected."""
import time

from PySide6.QtCore import QEvent, QPointF, QUrl
from PySide6.QtGui import QEnterEvent, QTextCursor
from PySide6.QtWidgets import QApplication

from app.chat_controller import LiveReply
from core.storage.chats import Message
from tests.qt_helpers import run_until
from tests.ui.helpers import ask, make_window
from tests.ui.scripted_engine import ScriptedEngine
from ui.chat_view import ChatView

LONG = "\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." for i in range(30))


def msg(mid, role, content, thinking="", status="complete", meta=None):
    return Message(mid, "c1", role, content, thinking, status, time.time(), meta or {})


def view_with(qtbot, messages, live=None, **kw):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    view.render(messages, live, **kw)
    QApplication.processEvents()  # new cards show on the next turn of the event loop
    return view


def select(card, start=10, end=40):
    cursor = card.content.textCursor()
    cursor.setPosition(start)
    cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
    card.content.setTextCursor(cursor)
    return cursor.selectedText()


def test_streaming_keeps_a_selection_in_an_earlier_card_and_rebuilds_nothing_else(qtbot):
    history = [msg(1, "user", "Tell me a story"), msg(2, "assistant", LONG), msg(3, "user", "Another one"),
               msg(4, "assistant", "", status="streaming")]
    live = LiveReply(conversation_id="c1", message_id=4)
    view = view_with(qtbot, history, live, busy=True)
    cards = {mid: view.card(mid) for mid in (1, 2, 3, 4)}
    revisions = {mid: cards[mid].content.revision for mid in (1, 2, 3)}
    selected = select(cards[2])
    assert selected and cards[2].content.textCursor().hasSelection()
    for i in range(300):  # tokens arrive; the window redraws the live card every 50 ms and sometimes all
        live.answer += f"token{i} "
        if i % 10 == 0:
            assert view.update_live(live)
        if i % 100 == 50:
            view.render(history, live, busy=True)
    assert cards[2].content.textCursor().selectedText() == selected
    assert {mid: view.card(mid) for mid in (1, 2, 3, 4)} == cards  # the same widgets
    assert {mid: cards[mid].content.revision for mid in (1, 2, 3)} == revisions  # documents not rebuilt
    assert "token290" in cards[4].content.toPlainText()
    done = history[:3] + [msg(4, "assistant", live.answer)]
    view.render(done, None)
    assert view.card(4) is cards[4] and cards[2].content.textCursor().selectedText() == selected


def test_auto_scroll_only_when_at_the_bottom(qtbot):
    history = [msg(i, "user" if i % 2 else "assistant", LONG) for i in range(1, 7)] + [
        msg(7, "assistant", "", status="streaming")]
    live = LiveReply(conversation_id="c1", message_id=7)
    view = view_with(qtbot, history, live, busy=True)
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    bar.setValue(bar.maximum())
    live.answer = LONG
    view.update_live(live)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() and bar.maximum() > 0)
    bar.setValue(100)  # the user scrolls up to read
    live.answer += "\n\n" + LONG
    view.update_live(live)
    qtbot.wait(50)
    assert bar.value() == 100 and bar.maximum() > 100


def test_math_and_code_render_through_the_card(qtbot):
    text = ("The area is $\\pi r^2$, so $\\boxed{8}$.\n\n```python\nif a < b and c & d:\n    print('<tag>')\n```\n"
            "And <b>not bold</b> &amp; literal.")
    view = view_with(qtbot, [msg(1, "user", "Area?"), msg(2, "assistant", text)])
    card = view.card(2)
    assert card.content.images, "formulas are drawn as images"
    plain = card.content.toPlainText()
    assert "if a < b and c & d:" in plain and "print('<tag>')" in plain
    assert "<b>not bold</b> & literal" in plain  # typed HTML shown as text (an entity is CommonMark's)
    assert list(view.code_blocks.values()) == ["if a < b and c & d:\n    print('<tag>')"]
    key = next(iter(view.code_blocks))
    with qtbot.waitSignal(view.action) as got:
        card.content.linkClicked.emit(f"ponder:copycode/{key}")
    assert got.args == ["copycode", [key]]


def test_links_in_a_message_never_run_an_action(qtbot):
    trap = "[again](ponder:regenerate/2) [gone](ponder:delete/1) [edit](ponder:edit/999) [pick](ponder:pick/2/0)"
    view = view_with(qtbot, [msg(1, "user", trap), msg(2, "assistant", f"{trap}\n\n```\nx = 1\n```")])
    got = []
    view.action.connect(lambda verb, args: got.append((verb, args)))
    for mid in (1, 2):
        for url in ("ponder:regenerate/2", "ponder:delete/1", "ponder:edit/999", "ponder:pick/2/0",
                    "ponder:branch/2/+1", "ponder:copycode/nope", "https://example.com"):
            view.card(mid).content.anchorClicked.emit(QUrl(url))  # as a click on such a link would
    assert got == []
    key = next(iter(view.card(2).code_blocks))
    view.card(2).content.anchorClicked.emit(QUrl(f"ponder:copycode/{key}"))  # the code block's own Copy link
    assert got == [("copycode", [key])]


def test_a_huge_table_in_a_reply_is_drawn_bounded_and_copies_whole(qtbot):
    from PySide6.QtGui import QTextTable

    from ui.markdown_tables import MAX_TABLE_ROWS

    table = "| n | square |\n|---|---|\n" + "\n".join(f"| {i} | {i * i} |" for i in range(2000))
    view = view_with(qtbot, [msg(1, "user", "Squares?"), msg(2, "assistant", f"Here:\n\n{table}")])
    card = view.card(2)
    (drawn,) = [f for f in card.content.document().rootFrame().childFrames() if isinstance(f, QTextTable)]
    assert drawn.rows() == 1 + MAX_TABLE_ROWS and "more rows not shown" in view.toPlainText()
    got = []
    view.action.connect(lambda verb, args: got.append((verb, args)))
    card.content.anchorClicked.emit(QUrl("ponder:copycode/2-table-2"))  # the note's Copy link
    assert got == [("copycode", ["2-table-2"])] and view.code_blocks["2-table-2"] == table  # what the window copies


def test_a_finished_trace_is_typeset_and_a_live_one_grows_as_text(qtbot):
    trace = "Half of $\\frac{16}{2}$ is **8**, and <b>a tag</b> stays text."
    meta = {"route": {"reason": True}, "thinking_tokens": 20, "budget": 64}
    view = view_with(qtbot, [msg(1, "user", "Q"), msg(2, "assistant", "8", thinking=trace, meta=meta)])
    body = view.card(2).thinking.body
    assert body.images, "the trace's formula is drawn"
    assert "**" not in body.toPlainText() and "<b>a tag</b>" in body.toPlainText()
    live = LiveReply(conversation_id="c1", message_id=4, budget=64)
    view.render([msg(3, "user", "Q2"), msg(4, "assistant", "", status="streaming")], live, busy=True)
    thinking = view.card(4).thinking
    live.thinking, live.thinking_tokens = "Think **hard**", 3
    view.update_live(live)
    assert thinking.body.toPlainText() == "Think **hard**"  # raw while it streams (appended in place)
    live.answer = "Done"
    view.update_live(live)
    assert thinking.body.toPlainText().strip() == "Think hard" and thinking.header.text().startswith("Thought for")


def test_hover_buttons_have_names_and_emit_their_verbs(qtbot):
    meta = {"route": {"reason": True}, "thinking_tokens": 5, "budget": 8}
    view = view_with(qtbot, [msg(1, "user", "Why?"), msg(2, "assistant", "Because.", thinking="hmm", meta=meta)],
                     can_reason=True, can_delete=True)
    user, reply = view.card(1), view.card(2)
    assert user.offered("edit") and user.offered("copy") and not user.offered("regenerate")
    for verb in ("copy", "regenerate", "think", "details", "delete"):
        assert reply.offered(verb), verb
        button = reply.buttons[verb]
        assert button.accessibleName() and button.toolTip() and not button.icon().isNull()
        with qtbot.waitSignal(view.action) as got:
            button.click()
        assert got.args == [verb, ["2"]]
    with qtbot.waitSignal(view.action) as got:
        user.buttons["edit"].click()
    assert got.args == ["edit", ["1"]]
    QApplication.sendEvent(reply, QEvent(QEvent.Type.Leave))
    assert not reply.bar.isVisible()  # shown on hover
    QApplication.sendEvent(reply, QEnterEvent(QPointF(5, 5), QPointF(5, 5), QPointF(5, 5)))
    assert reply.bar.isVisible()
    QApplication.sendEvent(reply, QEvent(QEvent.Type.Leave))
    assert not reply.bar.isVisible()
    view.render([msg(1, "user", "Why?"), msg(2, "assistant", "Because.", thinking="hmm", meta=meta)],
                can_reason=False)
    assert not reply.offered("think") and not reply.offered("delete")  # the engine cannot think longer


def test_branch_navigation_shows_n_of_m_and_emits_branch(qtbot):
    history = [msg(1, "user", "Q"), msg(2, "assistant", "A second try")]
    view = view_with(qtbot, history, branches={2: (2, 3)})
    card = view.card(2)
    assert card.nav.isVisibleTo(card) and card.branch_label.text() == "2/3" and "‹ 2/3 ›" in view.toPlainText()
    assert not view.card(1).nav.isVisibleTo(view.card(1))
    for button, delta in ((card.prev_button, "-1"), (card.next_button, "+1")):
        assert button.accessibleName() and button.isEnabled()
        with qtbot.waitSignal(view.action) as got:
            button.click()
        assert got.args == ["branch", ["2", delta]]
    view.render(history, branches={2: (3, 3)})
    assert not card.next_button.isEnabled() and card.branch_label.text() == "3/3"


def test_a_failed_reply_is_an_error_card_with_retry(qtbot):
    view = view_with(qtbot, [msg(1, "user", "Q")])
    view.set_error(2, "the model crashed")
    view.render([msg(1, "user", "Q"), msg(2, "assistant", "Par", status="incomplete")])
    card = view.card(2)
    assert card.error.isVisibleTo(card) and "the model crashed" in view.toPlainText()
    with qtbot.waitSignal(view.action) as got:
        card.retry_button.click()
    assert got.args == ["retry", ["2"]]
    view.render([msg(1, "user", "Q"), msg(2, "assistant", "Par", status="cancelled",
                                          meta={"finish_reason": "cancelled"})])
    assert not card.error.isVisibleTo(card) and "Stopped." in view.toPlainText()


def test_an_error_shows_only_on_the_reply_it_belongs_to(qtbot):
    """A later error (another reply's, or one about no reply at all) never lands on an older failed reply."""
    history = [msg(1, "user", "Q1"), msg(2, "assistant", "Par", status="incomplete"), msg(3, "user", "Q2"),
               msg(4, "assistant", "A2", status="incomplete")]
    view = view_with(qtbot, history[:2])
    view.set_error(2, "the model crashed")
    view.render(history[:2])
    assert "This answer failed: the model crashed" in view.toPlainText()
    view.set_error(4, "out of memory")
    view.render(history)
    old, new = view.card(2), view.card(4)
    assert "the model crashed" in old.error_label.text() and "out of memory" not in old.error_label.text()
    assert "out of memory" in new.error_label.text()


def test_formulas_in_the_transcript_follow_the_text_size(qtbot):
    """ChatView.set_font_size redraws the shown cards' formulas at the new size; later cards are drawn at it."""
    def heights(card):
        return [img.deviceIndependentSize().height() for img in card.content.images.values()]

    history = [msg(1, "user", "Q"), msg(2, "assistant", "So $x^2$ it is.", meta={"finish_reason": "stop"})]
    view = view_with(qtbot, history)
    (small,) = heights(view.card(2))
    view.set_font_size(22)
    (large,) = heights(view.card(2))
    assert large > 1.5 * small
    view.render([*history, msg(3, "user", "Q2"), msg(4, "assistant", "And $x^2$.", meta={"finish_reason": "stop"})])
    assert heights(view.card(4)) == [large]


def test_only_the_last_reply_offers_retry(qtbot):
    """Retry asks the branch's last question again: an older failed reply shows its error without Retry."""
    history = [msg(1, "user", "Q1"), msg(2, "assistant", "Par", status="error"), msg(3, "user", "Q2"),
               msg(4, "assistant", "A2", meta={"finish_reason": "stop"})]
    view = view_with(qtbot, history)
    old = view.card(2)
    assert old.error.isVisibleTo(old) and not old.retry_button.isVisibleTo(old)
    view.render([*history[:3], msg(4, "assistant", "A", status="error")])
    assert view.card(4).retry_button.isVisibleTo(view.card(4)) and not old.retry_button.isVisibleTo(old)
    view.render(history[:2])  # the older reply is the last one again (another branch shown)
    assert old.retry_button.isVisibleTo(old)


def test_parallel_answers_stream_as_one_row_each_with_phase_and_tokens(qtbot):
    live = LiveReply(conversation_id="c1", message_id=2, budget=64)
    view = view_with(qtbot, [msg(1, "user", "Q"), msg(2, "assistant", "", status="streaming")], live, busy=True)
    live.streams = {i: {"thinking": "abcd" * (i + 1), "answer": ""} for i in range(4)}
    live.streams[3]["answer"] = "42"
    view.update_live(live)
    rows = view.card(2).streams
    assert len(rows.rows) == 4 and rows.phases == {0: "thinking", 1: "thinking", 2: "thinking", 3: "answering"}
    assert rows.rows[1][3].text().endswith("2/64 thinking · 0 answer") and rows.rows[1][2].maximum() == 64
    live.streams[3]["phase"], live.streams[2]["phase"] = "verify", "done"  # the engine's PhaseEvents
    view.update_live(live)
    assert rows.phases == {0: "thinking", 1: "thinking", 2: "done", 3: "verifying"}
    assert rows.rows[3][1].text() == "verifying"
    thinking = view.card(2).thinking
    assert thinking.isVisibleTo(view.card(2)) and thinking.header.text().startswith("Thinking…")


def test_the_window_streams_an_answer_while_an_earlier_selection_stays(qtbot, loop, tmp_path):
    engine = ScriptedEngine()
    win = make_window(qtbot, loop, tmp_path, engine)
    win.resize(900, 700)
    win.show()
    first = ask(win, loop, "Why?", "reason", budget=64)
    card = win.view.card(first.id)
    revision, selected = card.content.revision, select(card, 0, 8)
    assert selected and "Thought for" in card.thinking.header.text()
    engine.delay_s = 0.15  # the scripted base answer: 4 tokens, 0.15 s apart
    win.composer.apply("base", 64, 1)
    win.composer.input.setPlainText("And again?")
    win.composer.send_button.click()
    assert run_until(loop, lambda: win.controller.live is not None and win.controller.live.answer, 10)
    live_card = win.view.card(win.controller.live.message_id)
    assert run_until(loop, lambda: "answer" in live_card.content.toPlainText(), 5)  # redrawn while streaming
    assert card.content.textCursor().selectedText() == selected and card.content.revision == revision
    assert run_until(loop, lambda: not win.service.busy, 30)
    win.render()
    assert win.view.card(first.id) is card and card.content.revision == revision
    assert card.content.textCursor().selectedText() == selected
    assert "The answer is 42." in live_card.content.toPlainText()
    win.service.shutdown()


def test_an_alternative_streams_below_the_shown_reply_and_takes_its_place_when_done(qtbot):
    shown = [msg(1, "user", "Q"), msg(2, "assistant", "Old answer")]
    live = LiveReply(conversation_id="c1", message_id=3, replaces=(2,), answer="New ans")
    view = view_with(qtbot, shown, live, busy=True)
    new = view.card(3)
    assert view.order == [1, 2, 3] and "Old answer" in view.toPlainText() and "New ans" in view.toPlainText()
    assert "The earlier answer stays until this one has finished." in view.toPlainText()
    view.render([shown[0], msg(3, "assistant", "New answer")], None, branches={3: (2, 2)})
    QApplication.processEvents()
    assert view.order == [1, 3] and view.card(3) is new and view.card(2) is None
    assert "Old answer" not in view.toPlainText() and "‹ 2/2 ›" in view.toPlainText()


def stream_long(qtbot, part: str, times: int):
    """A view whose second card streamed `part` `times` times; (view, live reply, card)."""
    view = view_with(qtbot, [msg(1, "user", "Sorting?"), msg(2, "assistant", "", status="streaming")],
                     LiveReply(conversation_id="c1", message_id=2), busy=True)
    live = LiveReply(conversation_id="c1", message_id=2)
    for _ in range(times):
        live.answer += part
        view.update_live(live)
    return view, live, view.card(2)


def test_a_long_answer_streams_in_frozen_chunks_and_finishes_without_a_rebuild(qtbot):
    part = "Merge sort runs in $O(n \\log n)$.\n\n```python\nif a < b:\n    a = b\n```\n\nThen we compare.\n\n"
    view, live, card = stream_long(qtbot, part, 60)
    assert len(card.chunks) >= 3 and all(c.images for c in card.chunks)  # math in each frozen chunk
    assert max(len(card.content.toPlainText()), 1) < 3000  # only the tail is redrawn per tick
    revisions = [c.revision for c in card.chunks]
    assert len(card.code_blocks) == 60 and set(card.code_blocks.values()) == {"if a < b:\n    a = b"}
    cursor = card.chunks[1].textCursor()  # the reader is selecting in a frozen chunk when the answer ends
    cursor.setPosition(3)
    cursor.setPosition(30, QTextCursor.MoveMode.KeepAnchor)
    card.chunks[1].setTextCursor(cursor)
    selected = cursor.selectedText()
    view.render([msg(1, "user", "Sorting?"), msg(2, "assistant", live.answer)], None)
    assert [c.revision for c in card.chunks] == revisions and "▌" not in view.toPlainText()
    assert card.chunks[1].textCursor().selectedText() == selected  # nothing redrawn under the selection
    assert view.toPlainText().count("Then we compare.") == 60 and len(view.code_blocks) == 60
    view.render([msg(1, "user", "Sorting?"), msg(2, "assistant", "Edited elsewhere")], None)
    assert not card.chunks and "Edited elsewhere" in view.toPlainText()


def test_a_long_answer_that_ends_with_nothing_selected_becomes_one_selectable_document(qtbot):
    part = "Quick sort picks a pivot and splits the list around it, $O(n \\log n)$ on average.\n\n"
    view, live, card = stream_long(qtbot, part, 80)
    assert len(card.chunks) >= 2
    view.render([msg(1, "user", "Sorting?"), msg(2, "assistant", live.answer)], None)
    assert not card.chunks and card.content.toPlainText().count("Quick sort picks") == 80
    card.content.selectAll()  # one selection from the first line to the last
    assert card.content.textCursor().selectedText().count("Quick sort picks") == 80


def test_the_window_regenerates_navigates_versions_and_deletes_through_the_cards(qtbot, loop, tmp_path, monkeypatch):
    from ui import dialogs

    win = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    first = ask(win, loop, "Why?", "base")
    win.view.card(first.id).buttons["regenerate"].click()
    assert run_until(loop, lambda: not win.service.busy and win.controller.messages()[-1].id != first.id, 10)
    win.render()
    second = win.controller.messages()[-1]
    card = win.view.card(second.id)
    assert card.branch_label.text() == "2/2" and card.nav.isVisibleTo(card)
    card.prev_button.click()  # ‹ : back to the first answer
    assert run_until(loop, lambda: win.controller.messages()[-1].id == first.id, 5)
    assert win.view.card(first.id).branch_label.text() == "1/2" and win.view.card(second.id) is None
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, parent, title, text: True))
    win.view.card(first.id).buttons["delete"].click()
    assert run_until(loop, lambda: win.controller.messages()[-1].id == second.id, 5)
    win.render()
    assert win.view.card(first.id) is None and not win.view.card(second.id).nav.isVisibleTo(win.view.card(second.id))
    win.service.shutdown()


def test_switching_to_the_dark_theme_redraws_the_cards_in_dark_colours(qtbot, qapp):
    from ui.theme import apply_theme

    view = view_with(qtbot, [msg(1, "user", "Code?"), msg(2, "assistant", "```python\nx = 1\n```")])
    card = view.card(2)
    light, revision = card.content.toHtml(), card.content.revision
    palette, sheet, style = qapp.palette(), qapp.styleSheet(), qapp.style().name()
    try:
        apply_theme("dark", qapp)
        QApplication.processEvents()
        assert card.content.revision > revision and card.content.toHtml() != light
    finally:  # the application's look as it was
        qapp.setStyleSheet(sheet)
        qapp.setPalette(palette)
        qapp.setStyle(style)
        qapp.setProperty("ponder_mode", None)
        qapp.setProperty("ponder_theme", None)


def test_another_chat_opens_at_its_end(qtbot):
    chat_a = [msg(i, "user" if i % 2 else "assistant", LONG) for i in range(1, 7)]
    view = view_with(qtbot, chat_a)
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    bar.setValue(0)  # the user scrolled up in chat A
    view.render([msg(i, "user" if i % 2 else "assistant", LONG) for i in range(11, 17)])
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
