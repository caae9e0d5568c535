"""Branching through the ChatController on the real sqlite store: regenerate, edit and think longer add siblings
(nothing deleted), ‹ n/m › navigation changes messages() and survives a restart, think longer continues on the
kept cache of the real tiny reasoning engine, each chat's system prompt and sampling reach the engine, pinned
chats, deleting a message with what follows it."""
import pytest

from app.chat_controller import ChatController, ReplyOptions
from app.engine_service import EngineService
from core.prompting.chat_format import DEFAULT_SYSTEM
from core.storage.chats import ChatStore
from tests.qt_helpers import run_until
from tests.tiny import make_reasoning_engine
from tests.ui.scripted_engine import ScriptedEngine

BASE = ReplyOptions(mode="base", budget=None, temperature=0.0)


class RecordingEngine(ScriptedEngine):
    """The scripted engine, also recording each request's system prompt and sampling."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.requests: list[dict] = []

    def stream(self, messages, sampling=None, *, system=None, **kw):
        self.requests.append({"system": system, "sampling": sampling, "messages": list(messages)})
        return super().stream(messages, sampling, system=system, **kw)

    def think_longer(self, messages, thinking, *, system=None, sampling=None, **kw):
        self.requests.append({"system": system, "sampling": sampling, "messages": list(messages)})
        return super().think_longer(messages, thinking, system=system, sampling=sampling, **kw)


def make(loop, path, engine):
    service = EngineService(engine=engine)
    loop.run_until_complete(service.start())
    return ChatController(service, ChatStore(path, flush_s=0.01))


@pytest.fixture
def engine():
    return RecordingEngine()


@pytest.fixture
def ctl(loop, tmp_path, engine):
    c = make(loop, tmp_path / "chats.db", engine)
    yield c
    c.service.shutdown()


def view(ctl):
    return [(m.role, m.content) for m in ctl.messages()]


def test_regenerate_twice_makes_three_siblings_navigable_and_kept_after_a_restart(ctl, loop, tmp_path):
    loop.run_until_complete(ctl.send("Tell me", BASE))
    first = ctl.messages()[-1]
    loop.run_until_complete(ctl.regenerate(BASE))
    loop.run_until_complete(ctl.regenerate(BASE))
    msgs = ctl.messages()
    assert [m.role for m in msgs] == ["user", "assistant"]  # nothing deleted, only the newest shown
    third = msgs[1]
    sibs = ctl.store.siblings(third.id)
    assert len(sibs) == 3 and sibs[0] == first.id and sibs[-1] == third.id
    assert all(m.parent_id == msgs[0].id for m in ctl.store.messages(ctl.current) if m.role == "assistant")
    assert ctl.branch(third) == (3, 3) and ctl.branch(msgs[0]) == (1, 1)
    changed = []
    ctl.messagesChanged.connect(lambda: changed.append(1))
    assert ctl.switch_branch(third.id, -1) and ctl.messages()[-1].id == sibs[1] and changed
    assert ctl.switch_branch(sibs[1], -1) and ctl.messages()[-1] == first and ctl.branch(first) == (1, 3)
    assert not ctl.switch_branch(first.id, -1)  # no wrap around
    assert ctl.switch_branch(first.id, +1) and ctl.branch(ctl.messages()[-1]) == (2, 3)
    assert not ctl.switch_branch(12345, +1)  # not a shown message
    cid, shown = ctl.current, ctl.messages()
    ctl.service.shutdown()
    again = make(loop, tmp_path / "chats.db", RecordingEngine())  # a restart
    try:
        again.open(cid)
        assert again.messages() == shown and again.branch(shown[-1]) == (2, 3)
    finally:
        again.service.shutdown()


def test_a_regenerated_reply_is_shown_only_once_it_finished_and_a_failed_one_stays_a_sibling(ctl, loop, engine):
    loop.run_until_complete(ctl.send("Tell me", BASE))
    old = ctl.messages()
    engine.crash_after = 2
    loop.run_until_complete(ctl.regenerate(BASE))
    assert ctl.messages() == old  # a failed alternative leaves the shown branch as it was
    partial = ctl.store.messages(ctl.current)[-1]
    assert (partial.status, partial.content, partial.parent_id) == ("incomplete", "The answer ", old[0].id)
    assert ctl.branch(old[1]) == (1, 2) and ctl.store.siblings(old[1].id) == [old[1].id, partial.id]
    engine.crash_after, engine.delay_s = None, 0.05
    task = loop.create_task(ctl.regenerate(BASE))
    assert run_until(loop, lambda: ctl.live is not None and ctl.live.answer, 10)
    live = ctl.current_live
    assert ctl.messages() == old  # the old reply stays shown while the new one streams
    assert live.replaces == (old[1].id,) and live.parent_id == old[0].id and live.message_id not in (old[1].id,
                                                                                                      partial.id)
    loop.run_until_complete(task)
    assert ctl.messages()[-1].id == live.message_id and ctl.messages()[-1].content == "The answer is 42."
    assert ctl.branch(ctl.messages()[-1]) == (3, 3)


def test_edit_makes_a_question_sibling_with_its_own_answer_and_the_old_branch_stays(ctl, loop, engine):
    loop.run_until_complete(ctl.send("Question one", BASE))
    loop.run_until_complete(ctl.send("Question two", BASE))
    before = ctl.messages()
    q2 = before[2]
    loop.run_until_complete(ctl.edit_and_resend(q2.id, "Question two, edited", BASE))
    assert engine.calls[-1][1]["messages"] == [{"role": "user", "content": "Question one"},
                                               {"role": "assistant", "content": "The answer is 42."},
                                               {"role": "user", "content": "Question two, edited"}]
    after = ctl.messages()
    assert after[:2] == before[:2] and view(ctl)[2:] == [("user", "Question two, edited"),
                                                         ("assistant", "The answer is 42.")]
    assert after[2].parent_id == before[1].id and ctl.branch(after[2]) == (2, 2)
    assert ctl.switch_branch(after[2].id, -1) and ctl.messages() == before  # the old turn, with its reply
    engine.crash_after = 0  # a failed answer keeps the edited question shown: the user's text is never lost
    loop.run_until_complete(ctl.edit_and_resend(before[0].id, "Question one, again", BASE))
    assert view(ctl)[0] == ("user", "Question one, again") and ctl.messages()[1].status == "incomplete"
    assert ctl.branch(ctl.messages()[0]) == (2, 2)
    assert ctl.switch_branch(ctl.messages()[0].id, -1) and ctl.messages() == before


def test_think_longer_adds_a_sibling_continuing_on_the_kept_cache(loop, tmp_path):
    """The real tiny engine with a reasoning adapter: the continuation is keyed to the new message's id."""
    engine = make_reasoning_engine()
    ctl = make(loop, tmp_path / "chats.db", engine)
    try:
        loop.run_until_complete(ctl.send("What is 2+2?", ReplyOptions(mode="reason", budget=6, temperature=0.0,
                                                                      answer_max_tokens=4, max_tokens=4)))
        old = ctl.messages()[-1]
        assert old.thinking and engine.has_trace(str(old.id))
        loop.run_until_complete(ctl.think_longer(old.id, extra_budget=4))
        msgs = ctl.messages()
        new = msgs[-1]
        assert [m.role for m in msgs] == ["user", "assistant"] and new.id != old.id
        assert new.meta["resumed"] == "cache" and new.thinking.startswith(old.thinking)
        assert new.parent_id == old.parent_id and ctl.branch(new) == (2, 2)
        assert engine.has_trace(str(new.id))  # the next "think longer" continues on this one
        assert ctl.switch_branch(new.id, -1) and ctl.messages()[-1] == old  # the old reply is kept as it was
        loop.run_until_complete(ctl.think_longer(old.id, extra_budget=2))  # its trace moved on: rebuilt from text
        third = ctl.messages()[-1]
        assert third.meta["resumed"] == "text" and ctl.branch(third) == (3, 3)
    finally:
        ctl.service.shutdown()


def test_each_chats_system_prompt_and_sampling_reach_the_engine(ctl, loop, engine):
    ctl.set_chat_settings(system_prompt="You are a pirate.", sampling={"temperature": 1.5, "answer_max_tokens": 64})
    loop.run_until_complete(ctl.send("Hello", ReplyOptions(mode="reason", budget=4)))  # a new chat gets them
    request = engine.requests[-1]
    assert request["system"] == "You are a pirate." and request["sampling"].temperature == 1.5
    assert request["sampling"].max_tokens == 64 and request["sampling"].top_p == BASE.top_p
    assert ctl.messages()[-1].meta["settings"]["system"] == "You are a pirate."
    loop.run_until_complete(ctl.think_longer(None, extra_budget=3))
    assert engine.requests[-1]["system"] == "You are a pirate."  # the prompt the trace was made with
    pirate = ctl.current
    ctl.new_chat()
    assert ctl.chat_settings() == {"system_prompt": None, "sampling": {}}
    loop.run_until_complete(ctl.send("Hello", BASE))
    assert engine.requests[-1]["system"] is None and engine.requests[-1]["sampling"].temperature == 0.0
    with pytest.raises(ValueError, match="temperature"):
        ctl.set_chat_settings(sampling={"temperature": 9})
    ctl.set_chat_settings(system_prompt="Answer in French.")
    loop.run_until_complete(ctl.regenerate(BASE))
    assert engine.requests[-1]["system"] == "Answer in French."
    ctl.open(pirate)
    assert ctl.chat_settings() == {"system_prompt": "You are a pirate.",
                                   "sampling": {"temperature": 1.5, "answer_max_tokens": 64}}
    ctl.set_chat_settings(sampling=None)
    assert ctl.chat_settings() == {"system_prompt": "You are a pirate.", "sampling": {}}


def test_the_system_prompt_is_the_system_message_of_the_real_engines_prompt(loop, tmp_path, tiny_engine,
                                                                          monkeypatch):
    seen = []
    real = tiny_engine.prompt_ids
    monkeypatch.setattr(tiny_engine, "prompt_ids", lambda messages, system=DEFAULT_SYSTEM: seen.append(
        (list(messages), system)) or real(messages, system))
    ctl = make(loop, tmp_path / "chats.db", tiny_engine)
    try:
        ctl.set_chat_settings(system_prompt="Reply in one word.")
        loop.run_until_complete(ctl.send("Hi", ReplyOptions(mode="base", budget=None, temperature=0.0,
                                                            answer_max_tokens=3, max_tokens=3)))
        assert seen[-1] == ([{"role": "user", "content": "Hi"}], "Reply in one word.")
        ids = real(*seen[-1])
        assert tiny_engine.tokenizer.decode(ids).count("Reply in one word.") == 1
        assert ctl.messages()[-1].status == "complete"
    finally:
        ctl.service.shutdown()


def test_pinned_chats_are_listed_first(ctl, loop):
    for text in ("first", "second"):
        ctl.new_chat()
        loop.run_until_complete(ctl.send(text, BASE))
    first = next(c["id"] for c in ctl.conversations() if c["title"] == "first")
    listed = []
    ctl.conversationsChanged.connect(lambda: listed.append([c["title"] for c in ctl.conversations()]))
    ctl.set_pinned(first, True)
    assert listed[-1] == ["first", "second"] and ctl.conversations()[0]["pinned"] == 1
    ctl.set_pinned(first, False)
    assert listed[-1] == ["second", "first"]


def test_deleting_a_message_removes_what_follows_it_and_shows_a_sibling(ctl, loop, engine):
    loop.run_until_complete(ctl.send("Q1", BASE))
    loop.run_until_complete(ctl.regenerate(BASE))
    second = ctl.messages()
    loop.run_until_complete(ctl.send("Q2", BASE))
    assert len(ctl.messages()) == 4
    ctl.switch_branch(second[1].id, -1)
    first_reply = ctl.messages()[1]
    ctl.switch_branch(first_reply.id, +1)
    assert ctl.delete_message(second[1].id)  # the reply and the turn that followed it
    assert ctl.messages() == [second[0], first_reply] and ctl.branch(first_reply) == (1, 1)
    assert [m.id for m in ctl.store.messages(ctl.current)] == [second[0].id, first_reply.id]
    assert not ctl.delete_message(999)
    engine.delay_s = 0.05
    task = loop.create_task(ctl.regenerate(BASE))
    assert run_until(loop, lambda: ctl.current_live is not None, 10)
    notes = []
    ctl.notice.connect(notes.append)
    assert not ctl.delete_message(first_reply.id) and not ctl.switch_branch(first_reply.id, 1) and notes
    ctl.service.cancel()
    loop.run_until_complete(task)
    assert ctl.delete_message(second[0].id) and ctl.messages() == []


def test_the_window_navigates_branches_with_the_card_buttons_and_after_a_restart(qtbot, loop, tmp_path):
    from tests.ui.helpers import ask, make_window, wait_idle

    win = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    first = ask(win, loop, "Tell me", "base")
    for _ in range(2):
        win.on_action("regenerate", [str(win.controller.messages()[-1].id)])
        wait_idle(win, loop)
    third = win.controller.messages()[-1]
    card = win.view.card(third.id)
    assert card.branch_label.text() == "3/3" and not card.next_button.isEnabled()
    card.prev_button.click()
    win.render()
    second = win.controller.messages()[-1]
    assert second.id not in (first.id, third.id) and win.view.card(second.id).branch_label.text() == "2/3"
    cid = win.controller.current
    win.service.shutdown()
    win.close()
    again = make_window(qtbot, loop, tmp_path, ScriptedEngine())  # a restart: the same database
    try:
        again.controller.open(cid)
        again.render()
        assert again.controller.messages()[-1].id == second.id
        card = again.view.card(second.id)
        assert card.branch_label.text() == "2/3"
        card.prev_button.click()
        again.render()
        assert again.controller.messages()[-1] == first and again.view.card(first.id).branch_label.text() == "1/3"
    finally:
        again.service.shutdown()


def test_parallel_streams_carry_exact_token_counts_for_their_rows(loop, tmp_path):
    """Each live stream counts its own thinking and answer tokens (the view's rows show them, not estimates)."""
    ctl = make(loop, tmp_path / "chats.db", make_reasoning_engine())
    seen = []
    ctl.liveUpdated.connect(lambda live: seen.append({i: dict(s) for i, s in live.streams.items()}))
    try:
        loop.run_until_complete(ctl.send("What is 2+2?", ReplyOptions(mode="reason", budget=6, parallel=2,
                                                                      temperature=0.7, answer_max_tokens=4)))
    finally:
        ctl.service.shutdown()
    last = seen[-1]
    assert sorted(last) == [0, 1]
    for stream in last.values():
        assert 1 <= stream["thinking_tokens"] <= 6
        assert stream["answer_tokens"] >= 1  # the forced "Final answer" prefix counts as answer tokens too


def test_regenerate_after_the_last_reply_was_deleted_answers_that_replys_own_question(qtbot, loop, tmp_path,
                                                                                       tiny_engine):
    """Deleting the last reply leaves its question unanswered: Regenerate on the reply before it answers that
    reply's question again (on the real tiny model), never the unanswered last one."""
    from dataclasses import replace

    from tests.ui.helpers import ask, make_window

    win = make_window(qtbot, loop, tmp_path, tiny_engine)
    win.settings = replace(win.settings, answer_max_tokens=16)
    try:
        ask(win, loop, "First?", "base")
        last = ask(win, loop, "Second?", "base")
        q1, r1, q2, _ = win.controller.messages()
        assert win.controller.delete_message(last.id)  # the reply only: its question stays
        assert win.controller.messages() == [q1, r1, q2] and win.view.offered(r1.id, "regenerate")
        rows = lambda: win.controller.store.messages(win.controller.current)  # noqa: E731
        win.view.card(r1.id).buttons["regenerate"].click()
        assert run_until(loop, lambda: len(rows()) == 4 and win.controller.live is None, 30)
        new = rows()[-1]
        assert new.role == "assistant" and new.parent_id == q1.id  # r1's question, not q2
        assert win.controller.messages() == [q1, new] and win.controller.branch(new) == (2, 2)
        win.controller.switch_branch(new.id, -1)  # the old branch, with its unanswered question, one step back
        assert win.controller.messages() == [q1, r1, q2]
    finally:
        win.service.shutdown()


def test_a_reply_with_no_question_before_it_cannot_be_regenerated(qtbot, loop, tmp_path, tiny_engine):
    """Nothing is left to answer (a chat whose first row is a reply): no Regenerate or Retry on it, and the
    action from a stale card does nothing."""
    from tests.ui.helpers import make_window

    win = make_window(qtbot, loop, tmp_path, tiny_engine)
    try:
        store = win.controller.store
        cid = store.new_conversation("Greeting")
        reply = store.add_message(cid, "assistant", "Hello!", status="error")
        win.controller.open(cid)
        card = win.view.card(reply)
        assert card is not None and not win.view.offered(reply, "regenerate")
        assert not card.retry_button.isVisibleTo(card)
        win.on_action("regenerate", [str(reply)])
        loop.run_until_complete(win.controller.regenerate(BASE, reply))
        loop.run_until_complete(win.controller.regenerate(BASE))
        assert [m.id for m in store.messages(cid)] == [reply] and not win.service.busy
    finally:
        win.service.shutdown()
