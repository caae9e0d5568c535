"""ChatController: one conversation at a time, between the chat store and the EngineService.

Saves the user's message, streams the reply into the store as it arrives (crash-safe, batched), keeps the
live reply (thinking, answer, candidate streams) for the view, and records route, stats, candidates, vote
and the settings used with every answer. Widgets call it; it never touches widgets.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from PySide6.QtCore import QObject, Signal

from core.config import SamplingConfig
from core.store import ChatStore, ReplyWriter

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
        self.conversationOpened.emit("")
        self.messagesChanged.emit()

    def open(self, cid: str) -> None:
        self.current = cid
        self.conversationOpened.emit(cid)
        self.messagesChanged.emit()

    def rename(self, cid: str, title: str) -> None:
        self.store.rename(cid, title)
        self.conversationsChanged.emit()

    def delete(self, cid: str) -> None:
        self._undo = self.store.delete(cid)
        if self.current == cid:
            self.new_chat()
        self.conversationsChanged.emit()

    def undo_delete(self) -> bool:
        if not self._undo:
            return False
        self.store.restore(self._undo)
        self._undo = None
        self.conversationsChanged.emit()
        return True

    def messages(self):
        return self.store.messages(self.current) if self.current else []

    # --- answering -----------------------------------------------------------------------------------
    def _history(self) -> list[dict]:
        return [{"role": m.role, "content": m.content} for m in self.messages() if m.content or m.role == "user"]

    async def send(self, text: str, options: ReplyOptions) -> None:
        text = text.strip()
        if not text or self.service.busy:
            return
        if self.current is None:
            self.current = self.store.new_conversation(text.splitlines()[0][:48])
            self.conversationsChanged.emit()
            self.conversationOpened.emit(self.current)
        self.store.add_message(self.current, "user", text)
        self.messagesChanged.emit()
        await self._answer(options)

    async def regenerate(self, options: ReplyOptions) -> None:
        msgs = self.messages()
        if not msgs or self.service.busy:
            return
        last_assistant = next((m for m in reversed(msgs) if m.role == "assistant"), None)
        if last_assistant is not None:
            self.store.delete_messages_after(self.current, last_assistant.id)
        self.messagesChanged.emit()
        await self._answer(options)

    async def edit_and_resend(self, message_id: int, text: str, options: ReplyOptions) -> None:
        if self.service.busy:
            return
        self.store.delete_messages_after(self.current, message_id)
        await self.send(text, options)

    async def _answer(self, options: ReplyOptions) -> None:
        sampling = SamplingConfig(temperature=options.temperature, top_p=options.top_p, top_k=options.top_k,
                                  repetition_penalty=options.repetition_penalty, max_tokens=options.max_tokens)
        self._writer = ReplyWriter(self.store, self.current, meta={"settings": asdict(options)})
        self.live = LiveReply(budget=options.budget if options.mode != "base" else None)
        answer = await self.service.ask(self._history(), sampling, mode=options.mode, budget=options.budget,
                                        answer_max_tokens=options.answer_max_tokens, parallel=options.parallel)
        self._finish(answer, options)

    async def think_longer(self, extra_budget: int = 256) -> None:
        msgs = self.messages()
        if not msgs or msgs[-1].role != "assistant" or self.service.busy:
            return
        last = msgs[-1]
        self.store.delete_messages_after(self.current, last.id)
        self._writer = ReplyWriter(self.store, self.current, meta=last.meta)
        self._writer.thinking = last.thinking
        self.live = LiveReply(thinking=last.thinking, budget=(last.meta.get("budget") or 0) + extra_budget)
        answer = await self.service.think_longer(extra_budget)
        self._finish(answer, ReplyOptions.from_meta(last.meta.get("settings")))

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

    def _finish(self, answer, options: ReplyOptions) -> None:
        writer, self._writer, self.live = self._writer, None, None
        if writer is None:
            return
        if answer is None:
            writer.finish("incomplete")
        else:
            writer.finish("cancelled" if answer.finish_reason == "cancelled" else "complete", content=answer.text,
                          thinking=answer.thinking, meta=answer_meta(answer, options))
        self.store.touch(self.current)
        self.conversationsChanged.emit()
        self.messagesChanged.emit()

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
    if answer.candidates:
        meta["candidates"] = [{"index": c.index, "text": c.text, "thinking": c.thinking, "answer": c.final_answer,
                               "score": c.score, "budget_forced": c.budget_forced} for c in answer.candidates]
        meta["vote"] = {"method": answer.vote_method, "table": [list(r) for r in answer.vote_table]}
        meta["chosen"] = answer.chosen
    return meta
