"""Chat history in SQLite (sqlite-utils): conversations (with each chat's skill adapter), messages with thinking
traces, candidates, routes and settings per answer; full-text search; versioned migrations; crash-safe streaming writes.

A reply is written while it streams (`ReplyWriter`, flushed at most every `flush_s`), so a crash loses at
most that interval; on the next open, replies left 'streaming' are marked 'incomplete'. A file that is not a
readable database is moved aside (kept as a backup) and a fresh one is created; a database written by a newer
Ponder is refused (`NewerDatabaseError`) and left untouched. No Qt here.
"""
from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils


def _m1_initial(db: sqlite_utils.Database) -> None:
    db["conversations"].create({"id": str, "title": str, "created": float, "updated": float}, pk="id")
    db["messages"].create({"id": int, "conversation_id": str, "role": str, "content": str, "status": str,
                           "created": float}, pk="id", foreign_keys=[("conversation_id", "conversations", "id")])
    db["messages"].create_index(["conversation_id"])


def _m2_reasoning(db: sqlite_utils.Database) -> None:
    db["messages"].add_column("thinking", str)
    db["messages"].add_column("meta", str)
    db["settings"].create({"key": str, "value": str}, pk="key")


def _m3_search(db: sqlite_utils.Database) -> None:
    db["messages"].enable_fts(["content", "thinking"], create_triggers=True, tokenize="porter")


def _m4_adapter(db: sqlite_utils.Database) -> None:
    """Each chat's skill adapter (a library name of the model it is used with; NULL = none)."""
    db["conversations"].add_column("adapter", str)


MIGRATIONS = [_m1_initial, _m2_reasoning, _m3_search, _m4_adapter]
SCHEMA_VERSION = len(MIGRATIONS)


class NewerDatabaseError(Exception):
    """The chat database was written by a newer Ponder (a higher schema version): it is not opened or changed."""

    def __init__(self, path: Path, version: int):
        super().__init__(f"The chat database {path} was written by a newer version of Ponder (schema {version}; "
                         f"this version reads up to {SCHEMA_VERSION}). Update Ponder to open it; it was left unchanged.")
        self.path, self.version = path, version


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: str
    role: str
    content: str
    thinking: str
    status: str
    created: float
    meta: dict


def _message(row: dict) -> Message:
    return Message(row["id"], row["conversation_id"], row["role"], row["content"] or "", row.get("thinking") or "",
                   row["status"], row["created"], json.loads(row.get("meta") or "{}"))


class ChatStore:
    def __init__(self, path: Path, flush_s: float = 0.5):
        self.path = Path(path)
        self.flush_s = flush_s
        self.recovered_from: Path | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = self._open()
        except sqlite3.DatabaseError:
            backup = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            self.path.replace(backup)
            for suffix in ("-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
            self.recovered_from = backup
            self.db = self._open()

    def _open(self) -> sqlite_utils.Database:
        conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA quick_check").fetchall()
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError:
            conn.close()
            raise
        if version > SCHEMA_VERSION:  # checked before anything is written (WAL mode, migrations)
            conn.close()
            raise NewerDatabaseError(self.path, version)
        db = sqlite_utils.Database(conn)
        db.enable_wal()
        db.execute("PRAGMA foreign_keys = ON")
        self._migrate(db)
        db.execute("UPDATE messages SET status = 'incomplete' WHERE status = 'streaming'")
        return db

    @staticmethod
    def schema_version(db: sqlite_utils.Database) -> int:
        return db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self, db: sqlite_utils.Database) -> None:
        version = self.schema_version(db)
        if version > SCHEMA_VERSION:
            raise NewerDatabaseError(self.path, version)
        for number, migration in enumerate(MIGRATIONS[version:], start=version + 1):
            with db.conn:
                migration(db)
                db.execute(f"PRAGMA user_version = {number}")

    # --- conversations ---------------------------------------------------------------------------------
    def new_conversation(self, title: str = "New chat") -> str:
        cid = uuid.uuid4().hex
        now = time.time()
        self.db["conversations"].insert({"id": cid, "title": title, "created": now, "updated": now})
        return cid

    def conversations(self) -> list[dict]:
        return list(self.db.query("SELECT * FROM conversations ORDER BY updated DESC"))

    def rename(self, cid: str, title: str) -> None:
        self.db["conversations"].update(cid, {"title": title.strip() or "Untitled"})

    def delete(self, cid: str) -> dict:
        """Delete a conversation; returns everything needed by `restore` (undo)."""
        snapshot = {"conversation": self.db["conversations"].get(cid),
                    "messages": list(self.db["messages"].rows_where("conversation_id = ?", [cid]))}
        with self.db.conn:
            self.db["messages"].delete_where("conversation_id = ?", [cid])
            self.db["conversations"].delete(cid)
        return snapshot

    def restore(self, snapshot: dict) -> None:
        with self.db.conn:
            self.db["conversations"].insert(snapshot["conversation"])
            if snapshot["messages"]:
                self.db["messages"].insert_all(snapshot["messages"])

    def adapter(self, cid: str) -> str | None:
        """The chat's skill adapter (None when it has none, or the chat does not exist)."""
        row = self.db.execute("SELECT adapter FROM conversations WHERE id = ?", [cid]).fetchone()
        return row[0] if row else None

    def set_adapter(self, cid: str, name: str | None) -> None:
        self.db["conversations"].update(cid, {"adapter": name or None})

    def rename_adapter(self, old: str, new: str | None) -> int:
        """Chats using skill adapter `old` use `new` instead (None: no adapter); returns how many changed."""
        cur = self.db.execute("UPDATE conversations SET adapter = ? WHERE adapter = ?", [new or None, old])
        return cur.rowcount

    def touch(self, cid: str) -> None:
        self.db["conversations"].update(cid, {"updated": time.time()})

    # --- messages --------------------------------------------------------------------------------------
    def add_message(self, cid: str, role: str, content: str, *, thinking: str = "", status: str = "complete",
                    meta: dict | None = None) -> int:
        row = {"conversation_id": cid, "role": role, "content": content, "thinking": thinking, "status": status,
               "created": time.time(), "meta": json.dumps(meta or {})}
        mid = self.db["messages"].insert(row).last_pk
        self.touch(cid)
        return mid

    def messages(self, cid: str) -> list[Message]:
        return [_message(r) for r in self.db["messages"].rows_where("conversation_id = ?", [cid], order_by="id")]

    def update_message(self, mid: int, **fields) -> None:
        if "meta" in fields:
            fields["meta"] = json.dumps(fields["meta"])
        self.db["messages"].update(mid, fields)

    def delete_messages(self, cid: str, ids) -> None:
        """Drop these messages of conversation `cid` (a reply replaced by a finished new one)."""
        ids = list(ids)
        if ids:
            marks = ",".join("?" * len(ids))
            self.db["messages"].delete_where(f"conversation_id = ? AND id IN ({marks})", [cid, *ids])

    def delete_messages_after(self, cid: str, mid: int) -> None:
        """Drop message `mid` and everything after it (regenerate / edit-and-resend)."""
        self.db["messages"].delete_where("conversation_id = ? AND id >= ?", [cid, mid])

    def search(self, text: str, limit: int = 50) -> list[dict]:
        """Full-text search over every chat's messages and thinking traces."""
        query = " ".join(f'"{w}"' for w in text.replace('"', " ").split())
        if not query:
            return []
        sql = ("SELECT m.id, m.conversation_id, c.title, snippet(messages_fts, -1, '[', ']', '…', 12) AS snippet "
               "FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid "
               "JOIN conversations c ON c.id = m.conversation_id WHERE messages_fts MATCH ? ORDER BY rank LIMIT ?")
        return list(self.db.query(sql, [query, limit]))

    def get_setting(self, key: str, default=None):
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", [key]).fetchone()
        return json.loads(row[0]) if row else default

    def set_setting(self, key: str, value) -> None:
        self.db["settings"].upsert({"key": key, "value": json.dumps(value)}, pk="key")

    def close(self) -> None:
        self.db.conn.close()


class ReplyWriter:
    """Writes one streaming reply: text and thinking appended in memory, flushed to disk at most every flush_s."""

    def __init__(self, store: ChatStore, cid: str, meta: dict | None = None):
        self.store = store
        self.id = store.add_message(cid, "assistant", "", status="streaming", meta=meta)
        self.content, self.thinking = "", ""
        self._last = time.monotonic()

    def append(self, text: str, kind: str = "answer") -> None:
        if kind == "thinking":
            self.thinking += text
        else:
            self.content += text
        if time.monotonic() - self._last >= self.store.flush_s:
            self.flush()

    def flush(self) -> None:
        self.store.update_message(self.id, content=self.content, thinking=self.thinking)
        self._last = time.monotonic()

    def finish(self, status: str, content: str | None = None, thinking: str | None = None, meta: dict | None = None):
        fields = {"content": self.content if content is None else content,
                  "thinking": self.thinking if thinking is None else thinking, "status": status}
        if meta is not None:
            fields["meta"] = meta
        self.store.update_message(self.id, **fields)


def export_markdown(store: ChatStore, cid: str) -> str:
    conv = store.db["conversations"].get(cid)
    out = [f"# {conv['title']}", ""]
    for m in store.messages(cid):
        out.append(f"## {'You' if m.role == 'user' else 'Ponder'}")
        if m.thinking:
            out += ["", "<details><summary>Thinking</summary>", "", m.thinking, "", "</details>"]
        out += ["", m.content + (" *(incomplete)*" if m.status == "incomplete" else ""), ""]
    return "\n".join(out)


def export_json(store: ChatStore, cid: str) -> str:
    conv = store.db["conversations"].get(cid)
    msgs = [{"role": m.role, "content": m.content, "thinking": m.thinking, "status": m.status, "created": m.created,
             "meta": m.meta} for m in store.messages(cid)]
    return json.dumps({"title": conv["title"], "created": conv["created"], "messages": msgs}, indent=2,
                      ensure_ascii=False)
