"""The chat database's schema: its versioned migrations (MIGRATIONS; a database's `PRAGMA user_version` is how
many have run, SCHEMA_VERSION all of them) and the errors for a database that cannot be opened (ChatDatabaseError)
or was written by a newer Ponder (NewerDatabaseError). core.storage.chats runs the migrations when it opens a
database. No Qt here.
"""
from __future__ import annotations

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


def _m5_branches_and_chat_settings(db: sqlite_utils.Database) -> None:
    """Messages form a tree (parent_id; existing chats become one branch: each message follows the previous one
    of its chat); `selected` (a per-chat counter: when a message was last on the shown branch) picks the child
    at a fork; each chat has its shown branch's end (active_leaf), a pin, a system prompt and sampling overrides
    (JSON). Safe to run again after an interruption (columns added once, the back-fill gives the same result)."""
    have = set(db["messages"].columns_dict)
    for name, kind in (("parent_id", int), ("selected", float)):
        if name not in have:
            db["messages"].add_column(name, kind)
    have = set(db["conversations"].columns_dict)
    for name, kind in (("active_leaf", int), ("system_prompt", str), ("sampling", str)):
        if name not in have:
            db["conversations"].add_column(name, kind)
    if "pinned" not in have:
        db["conversations"].add_column("pinned", int, not_null_default=0)
    db.execute("UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p WHERE "
               "p.conversation_id = messages.conversation_id AND p.id < messages.id)")
    db.execute("UPDATE conversations SET active_leaf = (SELECT MAX(m.id) FROM messages m "
               "WHERE m.conversation_id = conversations.id)")
    db["messages"].create_index(["parent_id"], if_not_exists=True)


MIGRATIONS = [_m1_initial, _m2_reasoning, _m3_search, _m4_adapter, _m5_branches_and_chat_settings]
SCHEMA_VERSION = len(MIGRATIONS)


class ChatDatabaseError(Exception):
    """The chat database could not be opened for a reason other than damage (locked, disk full, read-only, I/O):
    nothing was moved or changed."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"The chat database {path} could not be opened ({reason}). It was left unchanged; close "
                         "any other Ponder window using it, or free disk space, and start Ponder again.")
        self.path = path


class NewerDatabaseError(ChatDatabaseError):
    """The chat database was written by a newer Ponder (a higher schema version): it is not opened or changed."""

    def __init__(self, path: Path, version: int):
        Exception.__init__(self, f"The chat database {path} was written by a newer version of Ponder (schema "
                                 f"{version}; this version reads up to {SCHEMA_VERSION}). Update Ponder to open it; "
                                 "it was left unchanged.")
        self.path, self.version = path, version
