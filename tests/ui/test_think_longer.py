"""Think longer, regenerate and edit-and-resend never lose a stored reply: the new one streams into a new row, a
sibling of the old one, and is shown in its place only once it has finished; a failed, crashed or stopped one
leaves the shown branch as it was (what it produced stays a sibling). Think longer continues the trace of the
reply it was asked on (keyed by that message's id), in its own chat, after a restart too (the engine then
rebuilds the trace from the stored text). Real chat store (sqlite), scripted engine, the window driven as a user
would."""
import pytest

from app.chat_controller import ChatController
from app.engine_service import EngineService
from core.prompting.prompts import reasoning_prompts
from core.storage.chats import ChatStore
from tests.qt_helpers import run_until
from tests.ui.helpers import ask, make_window, wait_idle
from tests.ui.scripted_engine import ScriptedEngine
from ui.chat_view import details_text


def snapshot(win):
    return [(m.id, m.role, m.content, m.thinking, m.status) for m in win.controller.messages()]


def think_longer(win, loop, reply):
    assert win.view.offered(reply.id, "think")  # the Think longer button on the card
    win.on_action("longer", [str(reply.id)])
    wait_idle(win, loop)
    return win.controller.messages()


@pytest.fixture
def engine():
    return ScriptedEngine()


@pytest.fixture
def window(qtbot, loop, tmp_path, engine):
    win = make_window(qtbot, loop, tmp_path, engine)
    yield win
    win.service.shutdown()


def test_stream_keys_the_trace_to_the_reply(window, loop, engine):
    reply = ask(window, loop, "Question A", "reason")
    call = engine.calls[-1]
    assert call[0] == "stream" and call[1]["trace_key"] == str(reply.id)
    assert engine.traces[str(reply.id)][1] == reply.thinking


def test_think_longer_after_switching_chats_continues_that_chats_question(window, loop, engine):
    a = ask(window, loop, "Question A", "reason")
    chat_a = window.controller.current
    window.new_chat()
    b = ask(window, loop, "Question B", "reason")
    chat_b_before = snapshot(window)
    window.controller.open(chat_a)
    window.render()
    msgs = think_longer(window, loop, a)
    name, call = engine.calls[-1]
    assert name == "think_longer"
    assert call["messages"] == [{"role": "user", "content": "Question A"}] and call["thinking"] == a.thinking
    assert call["trace_key"] == str(a.id) and call["resumed"] == "cache" and call["budget"] == 128
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[0].content == "Question A"
    new = msgs[1]
    assert new.id != a.id and call["new_trace_key"] == str(new.id)  # the continuation is keyed to its own row
    assert new.thinking.startswith(a.thinking) and "more0" in new.thinking and new.content.startswith("Final answer: 43")
    assert new.status == "complete" and new.meta["resumed"] == "cache" and new.meta["budget"] == 128 + 256
    assert window.controller.branch(new) == (2, 2) and window.controller.switch_branch(new.id, -1)
    assert window.controller.messages()[1] == a  # the reply it continued is kept, one step back
    other = [c["id"] for c in window.controller.conversations() if c["id"] != chat_a][0]
    window.controller.open(other)
    assert snapshot(window) == chat_b_before and snapshot(window)[-1][0] == b.id


def test_think_longer_after_a_restart_rebuilds_from_the_stored_reply(qtbot, loop, tmp_path):
    first = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    old = ask(first, loop, "What is 2+2?", "reason")
    cid = first.controller.current
    first.service.shutdown()
    first.close()  # the window saves its state; the database stays on disk for the next start

    engine = ScriptedEngine(delay_s=0.005)  # a fresh engine: no trace in memory
    win = make_window(qtbot, loop, tmp_path, engine)
    win.controller.open(cid)
    win.render()
    assert win.view.offered(old.id, "think")
    win.on_action("longer", [str(old.id)])
    assert run_until(loop, lambda: win.controller.live is not None and win.controller.live.thinking_tokens > 10)
    during = win.controller.messages()
    assert during[1] == old  # the old reply is untouched while the continuation streams
    wait_idle(win, loop)
    name, call = engine.calls[-1]
    assert name == "think_longer" and call["resumed"] == "text" and call["trace_key"] == str(old.id)
    assert call["messages"] == [{"role": "user", "content": "What is 2+2?"}] and call["thinking"] == old.thinking
    msgs = win.controller.messages()
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].thinking.startswith(old.thinking) and msgs[1].meta["resumed"] == "text"
    assert "rebuilt" in details_text(msgs[1])
    win.service.shutdown()


def test_failing_think_longer_leaves_the_reply_intact(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(think_error=RuntimeError("out of memory")))
    ask(win, loop, "Why?", "reason")
    before = snapshot(win)
    think_longer(win, loop, win.controller.messages()[-1])
    assert "out of memory" in win.status.text()
    assert snapshot(win) == before  # nothing new streamed: no extra row either
    win.service.shutdown()


def test_crash_while_thinking_longer_keeps_the_reply_and_the_partial_continuation(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(think_crash_after=3))
    reply = ask(win, loop, "Why?", "reason")
    msgs = think_longer(win, loop, reply)
    assert "crashed" in win.status.text()
    assert msgs[1] == reply and len(msgs) == 2  # still shown
    opener = reasoning_prompts()["think_longer"]
    partial = win.controller.store.messages(win.controller.current)[-1]  # kept as the reply's sibling
    assert win.controller.store.siblings(reply.id) == [reply.id, partial.id] and win.controller.branch(reply) == (1, 2)
    assert partial.status == "incomplete" and partial.thinking == reply.thinking + opener + "more0 more1 more2 "
    win.service.shutdown()


def test_crash_before_any_new_thinking_leaves_no_empty_row(qtbot, loop, tmp_path):
    """Only the "think longer" opener streamed before the crash: nothing new to keep, the reply stays the last."""
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(think_crash_after=0))
    reply = ask(win, loop, "Why?", "reason")
    msgs = think_longer(win, loop, reply)
    assert "crashed" in win.status.text()
    assert msgs[-1] == reply and len(msgs) == 2 and win.controller.branch(reply) == (1, 1)
    assert win.view.offered(reply.id, "think")  # still offered on the real reply
    win.service.shutdown()


def test_stopped_think_longer_leaves_the_reply_intact(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(delay_s=0.01))
    reply = ask(win, loop, "Why?", "reason")
    win.on_action("longer", [str(reply.id)])
    assert run_until(loop, lambda: win.controller.live is not None and win.controller.live.thinking_tokens > 10)
    win.composer.stopRequested.emit()
    wait_idle(win, loop)
    msgs = win.controller.messages()
    assert msgs[1] == reply and len(msgs) == 2  # still shown
    kept = [m for m in win.controller.store.messages(win.controller.current) if m.id not in (msgs[0].id, reply.id)]
    assert all(m.status == "cancelled" and m.parent_id == reply.parent_id for m in kept)  # a sibling, marked stopped
    assert all(m.thinking.startswith(reply.thinking) for m in kept)
    win.service.shutdown()


def test_think_longer_only_on_reasoning_replies_of_an_engine_that_can_reason(window, loop, engine):
    fast = ask(window, loop, "Hi", "base")
    assert not fast.thinking and not window.view.offered(fast.id, "think")
    reasoned = ask(window, loop, "Why?", "reason")
    assert window.view.offered(reasoned.id, "think")
    engine.can_reason = False  # e.g. another model without the adapter
    window.render()
    assert not any(window.view.offered(m.id, "think") for m in window.controller.messages())


def test_failed_regenerate_keeps_the_answer_and_a_finished_one_is_shown_as_its_sibling(window, loop, engine):
    first = ask(window, loop, "Tell me", "base")
    engine.crash_after = 1
    window.on_action("regen", [])
    wait_idle(window, loop)
    msgs = window.controller.messages()
    assert msgs[1] == first and len(msgs) == 2  # still shown
    partial = window.controller.store.messages(window.controller.current)[-1]
    assert partial.status == "incomplete" and partial.content == "The " and window.controller.branch(first) == (1, 2)
    engine.crash_after = None
    window.on_action("regen", [])
    wait_idle(window, loop)
    msgs = window.controller.messages()
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].id > first.id
    assert msgs[1].status == "complete" and msgs[1].content == "The answer is 42."
    assert engine.calls[-1][1]["messages"] == [{"role": "user", "content": "Tell me"}]
    assert window.controller.branch(msgs[1]) == (3, 3)  # nothing deleted: first, the partial, the new one
    window.controller.switch_branch(msgs[1].id, -2)
    assert window.controller.messages()[1] == first


def test_edit_and_resend_adds_a_question_sibling_and_the_old_turn_stays_reachable(window, loop, engine, monkeypatch):
    from ui import dialogs

    ask(window, loop, "Tell me", "base")
    before = snapshot(window)
    question = window.controller.messages()[0]
    monkeypatch.setattr(dialogs.EditDialog, "ask", classmethod(lambda cls, parent, current: "Tell me more"))
    engine.crash_after = 0
    window.on_action("edit", [str(question.id)])
    wait_idle(window, loop)
    msgs = window.controller.messages()
    assert (msgs[0].role, msgs[0].content) == ("user", "Tell me more")  # the edit is kept and shown
    assert msgs[1].status == "incomplete" and window.controller.branch(msgs[0]) == (2, 2)
    engine.crash_after = None
    window.on_action("edit", [str(msgs[0].id)])
    wait_idle(window, loop)
    msgs = window.controller.messages()
    assert [(m.role, m.content) for m in msgs] == [("user", "Tell me more"), ("assistant", "The answer is 42.")]
    assert window.controller.branch(msgs[0]) == (3, 3)
    window.controller.switch_branch(msgs[0].id, -2)
    assert snapshot(window) == before  # the original turn, with its reply


def test_history_sends_one_reply_per_question(tmp_path, qapp):
    from app.chat_controller import history

    store = ChatStore(tmp_path / "c.db")
    cid = store.new_conversation()
    store.add_message(cid, "user", "q1")
    store.add_message(cid, "assistant", "a1")
    store.add_message(cid, "assistant", "partial", status="cancelled")
    store.add_message(cid, "user", "q2")
    assert history(store.messages(cid)) == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                                            {"role": "user", "content": "q2"}]
    service = EngineService(engine=ScriptedEngine())
    assert ChatController(service, store).messages() == []
    service.shutdown()
