"""Chat store: CRUD, search, undo, export, migrations from every earlier schema, crash safety, corrupt files."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlite_utils

from core.storage.chat_schema import MIGRATIONS, SCHEMA_VERSION, ChatDatabaseError, NewerDatabaseError
from core.storage.chats import ChatStore, ReplyWriter, export_json, export_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_conversations_messages_search_export(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid = store.new_conversation("Primes")
    store.add_message(cid, "user", "Is 391 a prime number?")
    store.add_message(cid, "assistant", "No: 391 = 17 × 23.", thinking="try small factors", meta={"route": "reason"})
    other = store.new_conversation("Poems")
    store.add_message(other, "user", "Write a haiku about autumn leaves")
    assert [c["title"] for c in store.conversations()] == ["Poems", "Primes"]
    hits = store.search("factors")
    assert len(hits) == 1 and hits[0]["conversation_id"] == cid and "[factors]" in hits[0]["snippet"]
    assert {h["conversation_id"] for h in store.search("autumn")} == {other}
    assert store.search('"; DROP TABLE messages; --') == []  # typed text is data, never SQL
    md = export_markdown(store, cid)
    assert "# Primes" in md and "try small factors" in md and "17 × 23" in md
    data = json.loads(export_json(store, cid))
    assert data["messages"][1]["meta"] == {"route": "reason"}
    store.rename(cid, "Factoring")
    assert store.db["conversations"].get(cid)["title"] == "Factoring"


def test_delete_and_undo(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid = store.new_conversation("Keep me")
    store.add_message(cid, "user", "hello")
    snapshot = store.delete(cid)
    assert store.conversations() == [] and store.search("hello") == []
    store.restore(snapshot)
    assert [m.content for m in store.messages(cid)] == ["hello"] and store.search("hello")


def test_settings_roundtrip(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    store.set_setting("budget", 512)
    store.close()
    assert ChatStore(tmp_path / "chats.db").get_setting("budget") == 512


def test_damaged_stored_json_reads_as_unset_not_a_crash(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid = store.new_conversation("t")
    mid = store.add_message(cid, "assistant", "hi", meta={"budget": 1})
    store.db.execute("UPDATE messages SET meta = '{broken' WHERE id = ?", [mid])
    store.db["settings"].upsert({"key": "ui", "value": "{broken"}, pk="key")
    assert store.get_setting("ui", {"default": 1}) == {"default": 1}
    assert [m.meta for m in store.path(cid)] == [{}] and [m.content for m in store.path(cid)] == ["hi"]


def test_stored_json_objects_read_leniently(tmp_path):
    """One reader for the chat database's JSON columns and the model store's JSON files: anything but a JSON
    object (nothing, damaged, another type, a file missing or not UTF-8) reads as {}."""
    from core.storage.stored_json import json_object, read_json_object

    assert json_object('{"a": 1}') == {"a": 1}
    assert [json_object(t) for t in (None, "", "{broken", "[1, 2]", "3")] == [{}] * 5
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"display_name": "Tiny"}', encoding="utf-8")
    assert read_json_object(good) == {"display_name": "Tiny"}
    for content in (b"", b"[1, 2", b'"text"', b"\xff\xfe{"):
        bad.write_bytes(content)
        assert read_json_object(bad) == {}
    assert read_json_object(tmp_path / "missing.json") == {} and read_json_object(tmp_path) == {}


def test_migrates_from_every_earlier_schema(tmp_path):
    for version in range(1, SCHEMA_VERSION):
        path = tmp_path / f"v{version}.db"
        db = sqlite_utils.Database(path)
        for number, migration in enumerate(MIGRATIONS[:version], start=1):
            migration(db)
            db.execute(f"PRAGMA user_version = {number}")
        db["conversations"].insert({"id": "c1", "title": "Old", "created": 1.0, "updated": 1.0})
        db["messages"].insert({"conversation_id": "c1", "role": "user", "content": "old words", "status": "complete",
                               "created": 1.0})
        db.conn.close()
        store = ChatStore(path)
        assert ChatStore.schema_version(store.db) == SCHEMA_VERSION
        assert [m.content for m in store.messages("c1")] == ["old words"]
        assert store.search("words")[0]["conversation_id"] == "c1"
        assert store.adapter("c1") is None  # an old chat has no skill adapter
        store.set_adapter("c1", "sql-helper")
        store.close()
        assert ChatStore(path).adapter("c1") == "sql-helper"


def test_chat_adapter_set_cleared_renamed_and_kept_by_undo(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    a, b, c = (store.new_conversation(t) for t in "abc")
    store.set_adapter(a, "sql")
    store.set_adapter(b, "sql")
    store.set_adapter(c, "poems")
    assert store.rename_adapter("sql", "sql-helper") == 2
    assert [store.adapter(x) for x in (a, b, c)] == ["sql-helper", "sql-helper", "poems"]
    store.set_adapter(b, None)
    assert store.adapter(b) is None and store.adapter("no-such-chat") is None
    assert store.rename_adapter("poems", None) == 1 and store.adapter(c) is None
    store.restore(store.delete(a))
    assert store.adapter(a) == "sql-helper"


def test_corrupt_database_is_moved_aside_and_replaced(tmp_path):
    path = tmp_path / "chats.db"
    path.write_bytes(b"this is not sqlite" * 100)
    store = ChatStore(path)
    assert store.recovered_from is not None and store.recovered_from.read_bytes().startswith(b"this is not")
    assert store.conversations() == []
    store.new_conversation("works again")


def test_a_locked_database_is_refused_and_left_alone_with_its_wal(tmp_path):
    """Another Ponder holding the write lock is not damage: nothing is moved or deleted, the error says why, and the
    chats (some still only in the WAL) open once the lock is gone."""
    path = tmp_path / "chats.db"
    first = ChatStore(path)
    first.db.execute("PRAGMA wal_autocheckpoint = 0")
    cid = first.new_conversation("kept in the WAL")
    first.add_message(cid, "user", "hello")
    assert Path(str(path) + "-wal").stat().st_size > 0
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(ChatDatabaseError, match="locked") as err:
        ChatStore(path, busy_timeout_s=0.05)
    assert not isinstance(err.value, NewerDatabaseError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.db", "chats.db-shm", "chats.db-wal"]
    holder.execute("ROLLBACK")
    holder.close()
    again = ChatStore(path)
    assert again.recovered_from is None and [c["title"] for c in again.conversations()] == ["kept in the WAL"]


def test_damage_found_by_quick_check_moves_the_file_aside_with_its_wal(tmp_path):
    path = tmp_path / "chats.db"
    store = ChatStore(path)
    for i in range(40):
        store.add_message(store.new_conversation(f"chat {i}"), "user", "x" * 2000)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.db.conn.close()
    data = bytearray(path.read_bytes())
    data[2 * 4096] = 0x77  # page 3's b-tree page type: the file opens, and quick_check reports (not raises) damage
    path.write_bytes(bytes(data))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA quick_check").fetchall() != [("ok",)]
    conn.close()
    recovered = ChatStore(path)
    assert recovered.recovered_from is not None and recovered.recovered_from.read_bytes() == bytes(data)
    assert recovered.conversations() == []
    for suffix in ("", "-wal", "-shm"):  # a WAL left beside a damaged file (it may hold the latest chats) goes with it
        Path(str(tmp_path / "old.db") + suffix).write_bytes(suffix.encode() or b"db")
    recovered.file = tmp_path / "old.db"
    backup = recovered._set_aside()
    assert [Path(str(backup) + suffix).read_bytes() for suffix in ("", "-wal", "-shm")] == [b"db", b"-wal", b"-shm"]
    assert not any(Path(str(tmp_path / "old.db") + suffix).exists() for suffix in ("", "-wal", "-shm"))


def test_newer_schema_is_refused_not_destroyed(tmp_path):
    """A database from a newer Ponder is neither moved aside nor changed: opening it raises a clear error."""
    path = tmp_path / "chats.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute("INSERT INTO future VALUES ('keep me')")
    conn.commit()
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(NewerDatabaseError, match="newer version of Ponder") as err:
        ChatStore(path)
    assert err.value.version == SCHEMA_VERSION + 1 and err.value.path == path
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["chats.db"]


KILLED_WRITER = """
import sys, time
from core.storage.chats import ChatStore, ReplyWriter
store = ChatStore(sys.argv[1], flush_s=0.1)
cid = store.new_conversation("crash")
store.add_message(cid, "user", "tell me a long story")
writer = ReplyWriter(store, cid)
print(cid, flush=True)
for i in range(10000):
    writer.append(f"word{i} ")
    time.sleep(0.005)
"""


def test_reply_survives_sigkill_mid_stream(tmp_path):
    path = tmp_path / "chats.db"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    cid = proc.stdout.readline().strip()
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = ChatStore(path)
    msgs = store.messages(cid)
    assert [m.role for m in msgs] == ["user", "assistant"]
    reply = msgs[1]
    assert reply.status == "incomplete" and reply.content.startswith("word0 word1 ") and len(reply.content) > 50


def test_reply_writer_batches_and_finishes(tmp_path):
    store = ChatStore(tmp_path / "chats.db", flush_s=60)
    cid = store.new_conversation()
    w = ReplyWriter(store, cid)
    w.append("think", "thinking")
    w.append("Hello")
    assert store.messages(cid)[0].content == ""  # batched: not yet written
    w.finish("complete", meta={"tokens": 2})
    m = store.messages(cid)[0]
    assert (m.content, m.thinking, m.status, m.meta) == ("Hello", "think", "complete", {"tokens": 2})


def test_update_message_sets_only_message_columns_and_keeps_search_current(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    cid = store.new_conversation()
    mid = store.add_message(cid, "assistant", "draft", status="streaming")
    store.update_message(mid, content="The aardvark answer", status="complete", meta={"tokens": 3})
    m = store.messages(cid)[0]
    assert (m.content, m.status, m.meta) == ("The aardvark answer", "complete", {"tokens": 3})
    assert [hit["id"] for hit in store.search("aardvark")] == [mid]  # the full-text index follows the update
    with pytest.raises(ValueError, match="role"):
        store.update_message(mid, role="user")
    assert store.messages(cid)[0].role == "assistant"
