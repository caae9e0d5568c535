"""Chat history in SQLite (sqlite-utils): conversations (with each chat's skill adapter, pin, system prompt and
sampling overrides), messages with thinking traces, candidates, routes and settings per answer, kept as a tree
(each message's `parent_id`; regenerate / edit / think longer add siblings, `conversations.active_leaf` is the end
of the branch shown); full-text search; versioned migrations (core.storage.chat_schema); crash-safe streaming
writes.

A reply is written while it streams (`ReplyWriter`, flushed at most every `flush_s`), so a crash loses at
most that interval; on the next open, replies left 'streaming' are marked 'incomplete'. A file that is not a
database, or one SQLite reports corrupt, is moved aside with its -wal and -shm files (kept as a backup) and a fresh
one is created. Any other failure to open it (locked by another Ponder, disk full, read-only, I/O error) raises
`ChatDatabaseError` and touches nothing; so does a database written by a newer Ponder (`NewerDatabaseError`).
No Qt here.
"""
from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from core.storage.chat_schema import MIGRATIONS, SCHEMA_VERSION, ChatDatabaseError, NewerDatabaseError
from core.storage.stored_json import json_object

MESSAGE_COLUMNS = {"content", "thinking", "status", "meta", "parent_id", "selected"}
"""The columns `update_message` may set."""
_LEAF = object()
"""add_message's default parent: the end of the chat's shown branch."""
KEEP = object()
"""set_chat_settings: leave this setting as it is."""


class _Damaged(sqlite3.DatabaseError):
    """PRAGMA quick_check found damage."""


DAMAGE_CODES = (11, 26)
"""SQLITE_CORRUPT and SQLITE_NOTADB (primary result codes): the only errors for which a file is set aside."""


def _damaged(err: sqlite3.DatabaseError) -> bool:
    code = getattr(err, "sqlite_errorcode", None)
    return isinstance(err, _Damaged) or (code is not None and code & 0xFF in DAMAGE_CODES)


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
    parent_id: int | None = None
    """The message this one follows (None: the chat's first message, or one of its edits)."""


def _message(row: dict) -> Message:
    return Message(row["id"], row["conversation_id"], row["role"], row["content"] or "", row.get("thinking") or "",
                   row["status"], row["created"], json_object(row.get("meta")), row.get("parent_id"))


_PATH = ("WITH RECURSIVE up(id, depth) AS (SELECT id, 0 FROM messages WHERE id = ? UNION ALL "
         "SELECT m.parent_id, up.depth + 1 FROM messages m JOIN up ON m.id = up.id WHERE m.parent_id IS NOT NULL) "
         "SELECT messages.* FROM up JOIN messages ON messages.id = up.id ORDER BY up.depth DESC")
_DESCENDANTS = ("WITH RECURSIVE down(id) AS (SELECT ? UNION ALL SELECT m.id FROM messages m JOIN down "
                "ON m.parent_id = down.id) SELECT id FROM down")


class ChatStore:
    def __init__(self, path: Path, flush_s: float = 0.5, busy_timeout_s: float = 5.0):
        self.file = Path(path)
        """The database file (`path(cid)` is a chat's shown branch)."""
        self.flush_s = flush_s
        self.busy_timeout_s = busy_timeout_s
        self.recovered_from: Path | None = None
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.db = self._open()
            except sqlite3.DatabaseError as err:
                if not _damaged(err):
                    raise
                self.recovered_from = self._set_aside()
                self.db = self._open()
        except (sqlite3.Error, OSError) as err:
            aside = f"; the damaged file was kept as {self.recovered_from.name}" if self.recovered_from else ""
            raise ChatDatabaseError(self.file, f"{err}{aside}") from err

    def _set_aside(self) -> Path:
        """Move a damaged database and its -wal/-shm files (the WAL may hold the latest chats) to a backup name."""
        backup = self.file.with_name(f"{self.file.name}.corrupt-{int(time.time())}")
        self.file.replace(backup)
        for suffix in ("-wal", "-shm"):
            side = Path(str(self.file) + suffix)
            if side.exists():
                side.replace(Path(str(backup) + suffix))
        return backup

    def _open(self) -> sqlite_utils.Database:
        conn = sqlite3.connect(str(self.file), check_same_thread=False, isolation_level=None,
                               timeout=self.busy_timeout_s)
        try:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise _Damaged("; ".join(map(str, problems[:3])))
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError:
            conn.close()
            raise
        if version > SCHEMA_VERSION:  # checked before anything is written (WAL mode, migrations)
            conn.close()
            raise NewerDatabaseError(self.file, version)
        try:
            db = sqlite_utils.Database(conn)
            db.enable_wal()
            db.execute("PRAGMA foreign_keys = ON")
            self._migrate(db)
            db.execute("UPDATE messages SET status = 'incomplete' WHERE status = 'streaming'")
        except BaseException:
            conn.close()
            raise
        return db

    @staticmethod
    def schema_version(db: sqlite_utils.Database) -> int:
        return db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self, db: sqlite_utils.Database) -> None:
        version = self.schema_version(db)
        if version > SCHEMA_VERSION:
            raise NewerDatabaseError(self.file, version)
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
        """Every chat, pinned ones first, then most recently updated first (rows with `pinned` 0/1)."""
        return list(self.db.query("SELECT * FROM conversations ORDER BY pinned DESC, updated DESC"))

    def set_pinned(self, cid: str, pinned: bool) -> None:
        self.db["conversations"].update(cid, {"pinned": int(bool(pinned))})

    def chat_settings(self, cid: str) -> dict:
        """{'system_prompt': str | None, 'sampling': dict} of chat `cid` (sampling: its overrides, maybe {})."""
        row = self.db.execute("SELECT system_prompt, sampling FROM conversations WHERE id = ?", [cid]).fetchone()
        if row is None:
            return {"system_prompt": None, "sampling": {}}
        return {"system_prompt": row[0] or None, "sampling": json_object(row[1])}

    def set_chat_settings(self, cid: str, *, system_prompt=KEEP, sampling=KEEP) -> None:
        """Set chat `cid`'s system prompt (None or blank: the default) and/or sampling overrides (None: none);
        an argument left out stays as it is. Values are stored as given (the app layer checks them)."""
        fields = {}
        if system_prompt is not KEEP:
            fields["system_prompt"] = (system_prompt or "").strip() or None
        if sampling is not KEEP:
            fields["sampling"] = json.dumps(sampling) if sampling else None
        if fields:
            self.db["conversations"].update(cid, fields)

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
                    meta: dict | None = None, parent_id=_LEAF, activate: bool = True) -> int:
        """Add a message after `parent_id` (default: the end of the shown branch; None: a first message);
        `activate`: it becomes the end of the shown branch (False: a sibling shown only once selected)."""
        if parent_id is _LEAF:
            parent_id = self.leaf(cid)
        row = {"conversation_id": cid, "role": role, "content": content, "thinking": thinking, "status": status,
               "created": time.time(), "meta": json.dumps(meta or {}), "parent_id": parent_id}
        mid = self.db["messages"].insert(row).last_pk
        if activate:
            self._activate(cid, mid)
        self.touch(cid)
        return mid

    def messages(self, cid: str) -> list[Message]:
        """Every message of the chat, all branches, in creation order (`path` is the branch shown)."""
        return [_message(r) for r in self.db["messages"].rows_where("conversation_id = ?", [cid], order_by="id")]

    # --- branches --------------------------------------------------------------------------------------
    def leaf(self, cid: str) -> int | None:
        """The end of the chat's shown branch (None: no messages)."""
        row = self.db.execute("SELECT m.id FROM conversations c JOIN messages m ON m.id = c.active_leaf "
                              "AND m.conversation_id = c.id WHERE c.id = ?", [cid]).fetchone()
        return row[0] if row else self._descend(cid, None)

    def path(self, cid: str) -> list[Message]:
        """The shown branch, first message to last: at each fork the most recently selected child."""
        leaf = self.leaf(cid)
        return [] if leaf is None else [_message(r) for r in self.db.query(_PATH, [leaf])]

    def siblings(self, mid: int) -> list[int]:
        """Ids of the messages with the same parent and role as `mid` (itself included), oldest first."""
        row = self.db.execute("SELECT conversation_id, parent_id, role FROM messages WHERE id = ?", [mid]).fetchone()
        if row is None:
            return []
        return [r[0] for r in self.db.execute("SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? "
                                              "AND role = ? ORDER BY id", list(row))]

    def select(self, cid: str, mid: int) -> None:
        """Show the branch through `mid`: below it, at each fork, the most recently selected (else newest) child."""
        self._activate(cid, self._descend(cid, mid))

    def delete_branch(self, cid: str, mid: int) -> list[int]:
        """Delete message `mid` and everything that follows it on any branch; when the shown branch went through
        it, a sibling (the previous one, else the next) is shown instead, else its parent. Returns the ids gone."""
        msg = self.db.execute("SELECT parent_id FROM messages WHERE id = ? AND conversation_id = ?",
                              [mid, cid]).fetchone()
        if msg is None:
            return []
        ids = [r[0] for r in self.db.execute(_DESCENDANTS, [mid])]
        shown = self.leaf(cid) in ids
        sibs = self.siblings(mid)
        rest = [s for s in sibs if s != mid]
        earlier = [s for s in rest if s < mid]
        self.delete_messages(cid, ids)
        if shown:
            if rest:
                self.select(cid, earlier[-1] if earlier else rest[0])
            else:
                self.db["conversations"].update(cid, {"active_leaf": msg[0]})
        return ids

    def _descend(self, cid: str, mid: int | None) -> int | None:
        while True:
            row = self.db.execute("SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? "
                                  "ORDER BY COALESCE(selected, 0) DESC, id DESC LIMIT 1", [cid, mid]).fetchone()
            if row is None:
                return mid
            mid = row[0]

    def _activate(self, cid: str, leaf: int | None) -> None:
        """Make `leaf` the end of the shown branch and remember its messages as the selected ones at each fork."""
        self.db["conversations"].update(cid, {"active_leaf": leaf})
        if leaf is not None:
            ids = [m["id"] for m in self.db.query(_PATH, [leaf])]
            marks = ",".join("?" * len(ids))
            turn = self.db.execute("SELECT COALESCE(MAX(selected), 0) + 1 FROM messages WHERE conversation_id = ?",
                                   [cid]).fetchone()[0]  # a counter, not the clock: two selections never tie
            self.db.execute(f"UPDATE messages SET selected = ? WHERE id IN ({marks})", [turn, *ids])

    def update_message(self, mid: int, **fields) -> None:
        """One UPDATE statement (a streaming reply is flushed through here twice a second from the GUI thread:
        sqlite_utils' `update` first reads the table's columns and names, four statements instead of one)."""
        if "meta" in fields:
            fields["meta"] = json.dumps(fields["meta"])
        unknown = set(fields) - MESSAGE_COLUMNS
        if unknown:
            raise ValueError(f"not message columns: {sorted(unknown)}")
        columns = ", ".join(f"{name} = ?" for name in fields)
        self.db.execute(f"UPDATE messages SET {columns} WHERE id = ?", [*fields.values(), mid])

    def delete_messages(self, cid: str, ids) -> None:
        """Drop exactly these messages of conversation `cid` (e.g. an empty reply row; `delete_branch` also
        drops what follows a message and keeps the shown branch valid)."""
        ids = list(ids)
        if ids:
            marks = ",".join("?" * len(ids))
            self.db["messages"].delete_where(f"conversation_id = ? AND id IN ({marks})", [cid, *ids])

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
        try:
            return json.loads(row[0]) if row else default
        except (TypeError, ValueError):  # a damaged value reads as unset, so startup still works
            return default

    def set_setting(self, key: str, value) -> None:
        self.db["settings"].upsert({"key": key, "value": json.dumps(value)}, pk="key")

    def close(self) -> None:
        self.db.conn.close()


class ReplyWriter:
    """Writes one streaming reply: text and thinking appended in memory, flushed to disk at most every flush_s."""

    def __init__(self, store: ChatStore, cid: str, meta: dict | None = None, *, parent_id=_LEAF,
                 activate: bool = True):
        self.store = store
        self.id = store.add_message(cid, "assistant", "", status="streaming", meta=meta, parent_id=parent_id,
                                    activate=activate)
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
    """The shown branch as Markdown."""
    conv = store.db["conversations"].get(cid)
    out = [f"# {conv['title']}", ""]
    for m in store.path(cid):
        out.append(f"## {'You' if m.role == 'user' else 'Ponder'}")
        if m.thinking:
            out += ["", "<details><summary>Thinking</summary>", "", m.thinking, "", "</details>"]
        out += ["", m.content + (" *(incomplete)*" if m.status == "incomplete" else ""), ""]
    return "\n".join(out)


def export_json(store: ChatStore, cid: str) -> str:
    """`messages`: the shown branch; `all_messages`: every branch (each with its `id` and `parent_id`)."""
    conv = store.db["conversations"].get(cid)

    def row(m: Message, ids: bool) -> dict:
        out = {"role": m.role, "content": m.content, "thinking": m.thinking, "status": m.status,
               "created": m.created, "meta": m.meta}
        return {"id": m.id, "parent_id": m.parent_id, **out} if ids else out

    settings = store.chat_settings(cid)
    return json.dumps({"title": conv["title"], "created": conv["created"], "system_prompt": settings["system_prompt"],
                       "sampling": settings["sampling"], "messages": [row(m, False) for m in store.path(cid)],
                       "all_messages": [row(m, True) for m in store.messages(cid)]}, indent=2, ensure_ascii=False)
