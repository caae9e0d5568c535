"""Chats as trees in the real sqlite store: the branches migration from every earlier schema (the old linear order
becomes the shown branch), siblings, selection remembered at each fork and across a reopen, deleting a message
with what follows it, pinned chats first, per-chat system prompt and sampling, exports of the shown branch."""
import json

import sqlite_utils

from core.storage.chat_schema import MIGRATIONS, SCHEMA_VERSION, _m5_branches_and_chat_settings
from core.storage.chats import ChatStore, ReplyWriter, export_json, export_markdown

OLD_CHAT = [("user", "Is 391 prime?", "complete"), ("assistant", "No: 17 × 23.", "complete"),
            ("assistant", "Let me check again", "cancelled"), ("user", "And 397?", "complete"),
            ("assistant", "Yes, 397 is prime.", "complete")]


def old_database(path, version: int):
    """A database as Ponder left it at schema `version`: two chats whose messages interleave."""
    db = sqlite_utils.Database(path)
    for number, migration in enumerate(MIGRATIONS[:version], start=1):
        migration(db)
        db.execute(f"PRAGMA user_version = {number}")
    for cid, updated in (("c1", 1.0), ("c2", 2.0)):
        db["conversations"].insert({"id": cid, "title": cid, "created": 1.0, "updated": updated})
    for k, (role, content, status) in enumerate(OLD_CHAT):
        db["messages"].insert({"conversation_id": "c1", "role": role, "content": content, "status": status,
                               "created": float(k)})
        db["messages"].insert({"conversation_id": "c2", "role": role, "content": f"{content} (c2)",
                               "status": status, "created": float(k)})
    db.conn.close()


def contents(messages):
    return [m.content for m in messages]


def test_every_earlier_schema_migrates_to_one_branch_in_the_old_order(tmp_path):
    for version in range(1, SCHEMA_VERSION):
        path = tmp_path / f"v{version}.db"
        old_database(path, version)
        store = ChatStore(path)
        assert ChatStore.schema_version(store.db) == SCHEMA_VERSION
        for cid in ("c1", "c2"):
            linear = store.messages(cid)
            assert [m.role for m in linear] == [r for r, _, _ in OLD_CHAT]
            assert store.path(cid) == linear  # the shown branch is the old order
            assert [m.parent_id for m in linear] == [None] + [m.id for m in linear[:-1]]
            assert all(store.siblings(m.id) == [m.id] for m in linear)
        assert contents(store.path("c2"))[0] == "Is 391 prime? (c2)"
        assert store.search("397")[0]["conversation_id"] in ("c1", "c2")  # full-text search still works
        assert [(c["id"], c["pinned"]) for c in store.conversations()] == [("c2", 0), ("c1", 0)]
        assert store.chat_settings("c1") == {"system_prompt": None, "sampling": {}}
        last = store.path("c1")[-1].id
        writer = ReplyWriter(store, "c1")  # a new reply follows the shown branch's end
        writer.append("more")
        writer.finish("complete")
        assert store.path("c1")[-1].id == writer.id and store.path("c1")[-2].id == last
        store.close()
        again = ChatStore(path)
        assert contents(again.path("c1"))[-1] == "more" and ChatStore.schema_version(again.db) == SCHEMA_VERSION
        again.close()


def test_an_interrupted_branches_migration_runs_again_to_the_same_result(tmp_path):
    path = tmp_path / "v4.db"
    old_database(path, 4)
    db = sqlite_utils.Database(path)
    _m5_branches_and_chat_settings(db)  # a crash before user_version was written: it runs again on open
    db.conn.close()
    store = ChatStore(path)
    assert store.path("c1") == store.messages("c1") and len(store.path("c1")) == len(OLD_CHAT)


def chat(store):
    """q1 → a1 | a2 (regenerated, not yet shown)."""
    cid = store.new_conversation("tree")
    q1 = store.add_message(cid, "user", "q1")
    a1 = store.add_message(cid, "assistant", "a1")
    a2 = store.add_message(cid, "assistant", "a2", parent_id=q1, activate=False)
    return cid, q1, a1, a2


def test_siblings_select_and_the_choice_remembered_at_each_fork(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid, q1, a1, a2 = chat(store)
    assert contents(store.path(cid)) == ["q1", "a1"]  # a sibling added without activate is not shown
    assert store.siblings(a1) == store.siblings(a2) == [a1, a2] and store.siblings(q1) == [q1]
    store.select(cid, a2)
    assert contents(store.path(cid)) == ["q1", "a2"]
    q2 = store.add_message(cid, "user", "q2")  # follows the shown branch
    r1 = store.add_message(cid, "assistant", "r1")
    r2 = store.add_message(cid, "assistant", "r2", parent_id=q2)
    assert contents(store.path(cid)) == ["q1", "a2", "q2", "r2"] and store.siblings(r1) == [r1, r2]
    store.select(cid, r1)
    store.select(cid, a1)
    assert contents(store.path(cid)) == ["q1", "a1"]
    store.select(cid, a2)  # back to a2's branch: the reply chosen there last (r1), not the newest (r2)
    assert contents(store.path(cid)) == ["q1", "a2", "q2", "r1"]
    store.close()
    store = ChatStore(tmp_path / "chats.db")  # the shown branch and the choices survive a restart
    assert contents(store.path(cid)) == ["q1", "a2", "q2", "r1"]
    store.select(cid, a1)
    store.select(cid, a2)
    assert contents(store.path(cid))[-1] == "r1"


def test_edits_of_the_first_question_are_root_siblings(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid, q1, a1, _ = chat(store)
    e1 = store.add_message(cid, "user", "q1 edited", parent_id=None)
    store.add_message(cid, "assistant", "e-answer")
    assert store.siblings(q1) == [q1, e1] and contents(store.path(cid)) == ["q1 edited", "e-answer"]
    store.select(cid, q1)
    assert contents(store.path(cid)) == ["q1", "a1"]


def test_deleting_a_message_takes_what_follows_it_and_shows_a_sibling(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid, q1, a1, a2 = chat(store)
    store.select(cid, a2)
    q2 = store.add_message(cid, "user", "q2")
    r1 = store.add_message(cid, "assistant", "r1")
    a3 = store.add_message(cid, "assistant", "a3", parent_id=q1, activate=False)
    assert sorted(store.delete_branch(cid, a2)) == sorted([a2, q2, r1])
    assert contents(store.path(cid)) == ["q1", "a1"]  # the previous sibling is shown
    assert [m.id for m in store.messages(cid)] == [q1, a1, a3] and store.search("r1") == []
    store.delete_branch(cid, a1)
    assert contents(store.path(cid)) == ["q1", "a3"]  # no earlier sibling left: the next one
    store.delete_branch(cid, a3)
    assert contents(store.path(cid)) == ["q1"]  # no sibling: the parent ends the shown branch
    assert store.delete_branch(cid, 999) == [] and store.delete_branch("other-chat", q1) == []
    store.delete_branch(cid, q1)
    assert store.path(cid) == [] and store.messages(cid) == []
    store.add_message(cid, "user", "fresh start")
    assert contents(store.path(cid)) == ["fresh start"] and store.path(cid)[0].parent_id is None


def test_pinned_chats_come_first_then_the_most_recent(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    a, b, c = (store.new_conversation(t) for t in "abc")
    for cid in (a, b, c):
        store.add_message(cid, "user", "hi")  # updated: a < b < c
    assert [x["title"] for x in store.conversations()] == ["c", "b", "a"]
    store.set_pinned(a, True)
    assert [(x["title"], x["pinned"]) for x in store.conversations()] == [("a", 1), ("c", 0), ("b", 0)]
    store.set_pinned(b, True)
    assert [x["title"] for x in store.conversations()] == ["b", "a", "c"]
    store.add_message(a, "user", "again")
    assert [x["title"] for x in store.conversations()] == ["a", "b", "c"]
    store.set_pinned(a, False)
    store.close()
    assert [x["title"] for x in ChatStore(tmp_path / "chats.db").conversations()] == ["b", "a", "c"]


def test_chat_settings_kept_per_chat_through_a_restart_and_an_undone_delete(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid, q1, a1, a2 = chat(store)
    other = store.new_conversation("other")
    store.set_chat_settings(cid, system_prompt="  You are a pirate.  ", sampling={"temperature": 0.1, "top_k": 5})
    assert store.chat_settings(cid) == {"system_prompt": "You are a pirate.",
                                        "sampling": {"temperature": 0.1, "top_k": 5}}
    assert store.chat_settings(other) == {"system_prompt": None, "sampling": {}}
    store.set_chat_settings(cid, sampling={"top_p": 0.5})  # the system prompt left out: kept
    assert store.chat_settings(cid) == {"system_prompt": "You are a pirate.", "sampling": {"top_p": 0.5}}
    store.set_pinned(cid, True)
    store.select(cid, a2)
    store.close()
    store = ChatStore(tmp_path / "chats.db")
    assert store.chat_settings(cid)["system_prompt"] == "You are a pirate."
    store.restore(store.delete(cid))
    assert store.chat_settings(cid) == {"system_prompt": "You are a pirate.", "sampling": {"top_p": 0.5}}
    assert contents(store.path(cid)) == ["q1", "a2"] and store.siblings(a2) == [a1, a2]
    assert store.conversations()[0]["id"] == cid
    store.set_chat_settings(cid, system_prompt="", sampling=None)
    assert store.chat_settings(cid) == {"system_prompt": None, "sampling": {}}


def test_exports_show_the_shown_branch_and_json_keeps_every_branch(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid, q1, a1, a2 = chat(store)
    store.select(cid, a2)
    md = export_markdown(store, cid)
    assert "a2" in md and "a1" not in md
    data = json.loads(export_json(store, cid))
    assert [m["content"] for m in data["messages"]] == ["q1", "a2"]
    assert [(m["id"], m["parent_id"], m["content"]) for m in data["all_messages"]] == [
        (q1, None, "q1"), (a1, q1, "a1"), (a2, q1, "a2")]


def test_an_alternative_cut_by_a_crash_is_an_incomplete_sibling_and_the_shown_branch_is_kept(tmp_path):
    store = ChatStore(tmp_path / "chats.db", flush_s=0)
    cid, q1, a1, a2 = chat(store)
    writer = ReplyWriter(store, cid, parent_id=q1, activate=False)  # a regenerate streaming when the app died
    writer.append("half an ans")
    store.db.conn.close()  # no finish: as after a crash
    store = ChatStore(tmp_path / "chats.db")
    assert contents(store.path(cid)) == ["q1", "a1"]
    cut = store.messages(cid)[-1]
    assert (cut.id, cut.status, cut.content) == (writer.id, "incomplete", "half an ans")
    assert store.siblings(a1) == [a1, a2, writer.id]
