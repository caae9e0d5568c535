"""ChatController: one conversation at a time, between the chat store and the EngineService.

Saves the user's message, streams the reply into the store as it arrives (crash-safe, batched), keeps the
live reply (thinking, answer, candidate streams) for the view, and records route, stats, candidates, vote
and the settings used with every answer. Each chat may have a skill adapter (by library name, kept in the
store); it goes with every request of that chat as `ReplyOptions.skill`. Widgets call it; it never touches widgets.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.config import SamplingConfig
from core.prompts import reasoning_prompts
from core.store import ChatStore, ReplyWriter, export_json, export_markdown

from .settings import AppSettings, load_settings, save_settings

MODES = {"Auto": "auto", "Reason": "reason", "Fast": "base"}


@dataclass
class ReplyOptions:
    mode: str = "auto"
    budget: int | None = 256
    parallel: int = 1
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 40
    repetition_penalty: float = 1.05
    answer_max_tokens: int = 256
    max_tokens: int = 1024
    skill: str | None = None
    """The chat's skill adapter (library name) that answers; None = the base model."""

    @classmethod
    def from_meta(cls, settings: dict | None) -> ReplyOptions:
        """The options recorded with an earlier answer (keys this version does not know are ignored)."""
        known = {k: v for k, v in (settings or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class LiveReply:
    """What the view shows while an answer streams."""

    thinking: str = ""
    answer: str = ""
    thinking_tokens: int = 0
    budget: int | None = None
    started: float = field(default_factory=time.monotonic)
    streams: dict = field(default_factory=dict)
    """stream index -> {'thinking': str, 'answer': str} for parallel answers."""
    conversation_id: str | None = None
    message_id: int | None = None
    """The stored row the reply streams into."""
    replaces: tuple[int, ...] = ()
    """Rows this reply replaces once it has finished (regenerate, edit, think longer)."""


def history(messages) -> list[dict]:
    """The conversation as the model sees it: each question with one reply (the last finished one when a
    question kept several, e.g. a stopped "think longer" next to the answer it continued)."""
    out: list[dict] = []
    group: list = []

    def flush():
        if group:
            best = next((m for m in reversed(group) if m.status == "complete"), group[-1])
            out.append({"role": "assistant", "content": best.content})
            group.clear()

    for m in messages:
        if m.role == "user":
            flush()
            out.append({"role": "user", "content": m.content})
        elif m.content:
            group.append(m)
    flush()
    return out


def sampling_of(options: ReplyOptions) -> SamplingConfig:
    return SamplingConfig(temperature=options.temperature, top_p=options.top_p, top_k=options.top_k,
                          repetition_penalty=options.repetition_penalty, max_tokens=options.max_tokens)


class ChatController(QObject):
    conversationsChanged = Signal()
    conversationOpened = Signal(str)
    messagesChanged = Signal()
    liveUpdated = Signal(object)
    notice = Signal(str)

    def __init__(self, service, store: ChatStore):
        super().__init__()
        self.service = service
        self.store = store
        self.current: str | None = None
        self.adapter: str | None = None
        """The open chat's skill adapter (a new chat: the one it is created with)."""
        self.live: LiveReply | None = None
        self._writer: ReplyWriter | None = None
        self._undo: dict | None = None
        service.tokenReceived.connect(self._on_token)
        if store.recovered_from is not None:
            self.notice.emit(f"The chat database was unreadable; it was kept as {store.recovered_from.name} "
                             "and a fresh one was started.")

    # --- conversations -------------------------------------------------------------------------------
    def new_chat(self) -> None:
        self.current = None
        self.adapter = None
        self.conversationOpened.emit("")
        self.messagesChanged.emit()

    def open(self, cid: str) -> None:
        self.current = cid
        self.adapter = self.store.adapter(cid)
        self.conversationOpened.emit(cid)
        self.messagesChanged.emit()

    def set_adapter(self, name: str | None, remember: bool = True) -> None:
        """Use skill adapter `name` (None: none) in the open chat; `remember`: stored with the chat."""
        self.adapter = name or None
        if remember and self.current is not None:
            self.store.set_adapter(self.current, self.adapter)

    def rename_adapter(self, old: str, new: str | None) -> None:
        """A library adapter was renamed (`new`) or removed (None): the chats using it follow."""
        self.store.rename_adapter(old, new)
        if self.adapter == old:
            self.adapter = new

    def conversations(self) -> list[dict]:
        """Every chat, most recently updated first: {'id', 'title', 'created', 'updated'}."""
        return self.store.conversations()

    def search(self, text: str) -> list[dict]:
        """Full-text hits over all chats: {'id', 'conversation_id', 'title', 'snippet'}."""
        return self.store.search(text)

    def title(self, cid: str) -> str:
        return next((c["title"] for c in self.store.conversations() if c["id"] == cid), "")

    def export(self, cid: str, fmt: str) -> str:
        """The chat as Markdown ('md') or JSON ('json') text."""
        return export_markdown(self.store, cid) if fmt == "md" else export_json(self.store, cid)

    def rename(self, cid: str, title: str) -> None:
        self.store.rename(cid, title)
        self.conversationsChanged.emit()

    def delete(self, cid: str) -> bool:
        """Delete a chat (undoable); refused while that chat is being answered."""
        if self.live is not None and self.live.conversation_id == cid:
            self.notice.emit("Stop the answer before deleting this chat.")
            return False
        self._undo = self.store.delete(cid)
        if self.current == cid:
            self.new_chat()
        self.conversationsChanged.emit()
        return True

    def undo_delete(self) -> bool:
        if not self._undo:
            return False
        self.store.restore(self._undo)
        self._undo = None
        self.conversationsChanged.emit()
        return True

    def messages(self):
        return self.store.messages(self.current) if self.current else []

    @property
    def current_live(self) -> LiveReply | None:
        """The streaming reply when it belongs to the open chat."""
        live = self.live
        return live if live is not None and live.conversation_id == self.current else None

    # --- preferences and window state (kept in the chat database) -------------------------------------
    @property
    def data_dir(self) -> Path:
        return self.store.path.parent

    def load_settings(self) -> AppSettings:
        return load_settings(self.store)

    def save_settings(self, settings: AppSettings) -> None:
        save_settings(self.store, settings)

    def window_state(self) -> str | None:
        return self.store.get_setting("window_geometry")

    def save_window_state(self, value: str) -> None:
        self.store.set_setting("window_geometry", value)

    # --- answering -----------------------------------------------------------------------------------
    async def send(self, text: str, options: ReplyOptions) -> None:
        text = text.strip()
        if not text or self.service.busy:
            return
        if self.current is None:
            self.current = self.store.new_conversation(text.splitlines()[0][:48])
            if self.adapter is not None:
                self.store.set_adapter(self.current, self.adapter)
            self.conversationsChanged.emit()
            self.conversationOpened.emit(self.current)
        cid = self.current
        self.store.add_message(cid, "user", text)
        await self._answer(cid, history(self.store.messages(cid)), options)

    async def regenerate(self, options: ReplyOptions) -> None:
        """Answer the last question again; the old reply stays until the new one has finished."""
        msgs = self.messages()
        if not msgs or self.service.busy:
            return
        q = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
        if q is None:
            return
        await self._answer(self.current, history(msgs[: q + 1]), options, replaces=tuple(m.id for m in msgs[q + 1:]))

    async def edit_and_resend(self, message_id: int, text: str, options: ReplyOptions) -> None:
        """Ask `text` instead of message `message_id`; that message and what followed it are removed only
        once the new answer has finished."""
        text = text.strip()
        msgs = self.messages()
        idx = next((i for i, m in enumerate(msgs) if m.id == message_id), None)
        if not text or idx is None or self.service.busy:
            return
        cid = self.current
        self.store.add_message(cid, "user", text)  # kept even if the answer fails: the user's text is never lost
        await self._answer(cid, history(msgs[:idx]) + [{"role": "user", "content": text}], options,
                           replaces=tuple(m.id for m in msgs[idx:]))

    async def _answer(self, cid: str, messages: list[dict], options: ReplyOptions, replaces: tuple = ()) -> None:
        skill = {"skill": options.skill} if options.skill else {}

        async def call(key: str):
            return await self.service.ask(messages, sampling_of(options), mode=options.mode, budget=options.budget,
                                          answer_max_tokens=options.answer_max_tokens, parallel=options.parallel,
                                          trace_key=key, **skill)

        budget = options.budget if options.mode != "base" else None
        await self._run(cid, options, call, replaces=replaces, budget=budget)

    def can_think_longer(self, message) -> bool:
        """A reasoning reply (it has a trace) and an engine that can reason."""
        return bool(message.role == "assistant" and message.thinking and self.service.can_reason)

    async def think_longer(self, message_id: int | None = None, extra_budget: int = 256) -> None:
        """Continue a reasoning reply's trace (by default the chat's last reply) and answer again. The reply
        stays until the continuation has finished; a stopped or failed continuation leaves it as it was."""
        msgs = self.messages()
        if self.service.busy:
            return
        idx = next((i for i in reversed(range(len(msgs))) if msgs[i].role == "assistant"
                    and (message_id is None or msgs[i].id == message_id)), None)
        if idx is None or not self.can_think_longer(msgs[idx]):
            self.notice.emit("Only a reasoning answer can think longer.")
            return
        target = msgs[idx]
        q = max((i for i in range(idx) if msgs[i].role == "user"), default=-1)
        nxt = next((i for i in range(idx, len(msgs)) if msgs[i].role == "user"), len(msgs))
        replies = tuple(m.id for m in msgs[q + 1: nxt])  # the question's replies: this one, stopped attempts
        options = ReplyOptions.from_meta(target.meta.get("settings"))
        shown = target.meta.get("budget")  # the budget so far (grows with each continuation)
        budget = options.budget if "settings" in target.meta else shown  # the one its prompt was built with

        async def call(key: str):
            return await self.service.think_longer(
                history(msgs[: q + 1]), target.thinking, trace_key=str(target.id), new_trace_key=key,
                extra_budget=extra_budget, budget=budget, answer_max_tokens=options.answer_max_tokens,
                sampling=sampling_of(options))

        await self._run(self.current, options, call, replaces=replies, thinking=target.thinking,
                        budget=(shown or 0) + extra_budget, tokens=target.meta.get("thinking_tokens", 0))

    async def _run(self, cid: str, options: ReplyOptions, call, *, replaces: tuple = (), thinking: str = "",
                   budget: int | None = None, tokens: int = 0) -> None:
        """Stream a reply into a new row; rows in `replaces` are removed only when it finished."""
        writer = ReplyWriter(self.store, cid, meta={"settings": asdict(options)})
        writer.thinking = thinking
        self._writer = writer
        self.live = LiveReply(thinking=thinking, thinking_tokens=tokens, budget=budget, conversation_id=cid,
                              message_id=writer.id, replaces=tuple(replaces))
        self.messagesChanged.emit()
        answer = None
        try:
            answer = await call(str(writer.id))
        finally:
            self._finish(cid, writer, answer, options, tuple(replaces), thinking)

    def _on_token(self, event) -> None:
        if self.live is None or self._writer is None:
            return
        live = self.live
        stream = live.streams.setdefault(event.stream, {"thinking": "", "answer": ""})
        stream[event.kind] = stream.get(event.kind, "") + event.text
        if event.stream == 0:
            if event.kind == "thinking":
                live.thinking += event.text
                live.thinking_tokens = event.index + 1
                self._writer.append(event.text, "thinking")
            else:
                live.answer += event.text
                self._writer.append(event.text)
        self.liveUpdated.emit(live)

    def _finish(self, cid: str, writer: ReplyWriter, answer, options: ReplyOptions, replaces: tuple,
                base_thinking: str) -> None:
        self._writer, self.live = None, None
        if answer is None:  # failed (kept as incomplete), or stopped while still queued (kept as stopped)
            status = "cancelled" if self.service.stop_requested else "incomplete"
            content, thinking, meta = writer.content, writer.thinking, None
        else:
            status = "cancelled" if answer.finish_reason == "cancelled" else "complete"
            content, thinking, meta = answer.text, answer.thinking, answer_meta(answer, options)
        finished = status == "complete"
        opened = base_thinking + reasoning_prompts()["think_longer"]  # a continuation that only got its opener
        if replaces and not finished and not content.strip() and thinking in (base_thinking, opened):
            self._remove(cid, (writer.id,))  # nothing new: drop the empty replacement row
        else:
            writer.finish(status, content=content, thinking=thinking, meta=meta)
        if finished and replaces:
            self._remove(cid, replaces)
        self.store.touch(cid)
        self.conversationsChanged.emit()
        self.messagesChanged.emit()

    def _remove(self, cid: str, ids: tuple) -> None:
        self.store.delete_messages(cid, ids)

    def pick_candidate(self, message_id: int, index: int) -> None:
        """Use another candidate's answer as the reply."""
        msg = next(m for m in self.messages() if m.id == message_id)
        cand = msg.meta["candidates"][index]
        meta = {**msg.meta, "chosen": index, "picked_by_user": True}
        self.store.update_message(message_id, content=cand["text"], thinking=cand["thinking"], meta=meta)
        self.messagesChanged.emit()


def answer_meta(answer, options: ReplyOptions) -> dict:
    s = answer.stats
    route = answer.route
    meta = {
        "settings": asdict(options), "model": answer.model, "precision": s.precision, "kv": s.kv,
        "route": None if route is None else {"reason": route.reason, "probability": route.probability,
                                             "source": route.source},
        "adapter": answer.adapter, "thinking_tokens": answer.thinking_tokens, "answer_tokens": answer.answer_tokens,
        "budget": answer.budget, "budget_forced": answer.budget_forced, "ttft_s": s.ttft_s,
        "decode_tok_s": s.decode_tok_s, "tokens": s.completion_tokens, "finish_reason": answer.finish_reason,
    }
    if getattr(answer, "resumed", None):
        meta["resumed"] = answer.resumed
    if answer.candidates:
        meta["candidates"] = [c.to_dict() for c in answer.candidates]
        meta["vote"] = {"method": answer.vote_method, "table": [list(r) for r in answer.vote_table],
                        "tie": bool(getattr(answer, "vote_tie", False))}
        meta["chosen"] = answer.chosen
    return meta
