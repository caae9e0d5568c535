"""`ChatAnswering`, the answering part of ChatController (mixed into it): send, regenerate, edit and resend,
think longer and pick a candidate. Saves the user's message, streams the reply into the store as it arrives
(crash-safe, batched; a failed write is said once), keeps the live reply for the view, and records route, stats,
candidates, vote and the settings used with every answer. A new reply is a sibling of what it replaces, shown
only once it has finished. It never touches widgets.
"""
from __future__ import annotations

import sqlite3
from dataclasses import asdict

from core.events import PhaseEvent
from core.prompting.prompts import reasoning_prompts
from core.storage.chats import ReplyWriter

from .replies import LiveReply, ReplyOptions, answer_meta, history, sampling_of


class ChatAnswering:
    """ChatController's answering; needs its service, store, current, adapter, live, _writer, _write_error,
    _pending, messages, with_chat_settings and signals."""

    # --- answering -----------------------------------------------------------------------------------
    async def send(self, text: str, options: ReplyOptions) -> None:
        text = text.strip()
        if not text or self.service.busy:
            return
        try:
            if self.current is None:
                self.current = self.store.new_conversation(text.splitlines()[0][:48])
                if self.adapter is not None:
                    self.store.set_adapter(self.current, self.adapter)
                self.store.set_chat_settings(self.current, **self._pending)
                self.conversationsChanged.emit()
                self.conversationOpened.emit(self.current)
            cid = self.current
            options = self.with_chat_settings(options)
            question = self.store.add_message(cid, "user", text)
        except sqlite3.Error as err:
            self.notice.emit(f"Your question could not be saved ({err}); it is back in the box. Free some disk "
                             "space (or close another Ponder using this chat history) and send it again.")
            self.sendFailed.emit(text)
            return
        await self._answer(cid, history(self.store.path(cid)), options, parent_id=question)

    async def regenerate(self, options: ReplyOptions, message_id: int | None = None) -> None:
        """Answer the question of reply `message_id` (None: the shown branch's last reply) again, as a new sibling
        of that reply: what follows the question stays shown until the new reply has finished, then the new one is
        (the old one step back with ‹). Nothing happens without such a reply or a question before it (a delete)."""
        msgs = self.messages()
        r = next((i for i in reversed(range(len(msgs))) if msgs[i].role == "assistant"
                  and message_id in (None, msgs[i].id)), None)
        q = None if r is None else next((i for i in reversed(range(r)) if msgs[i].role == "user"), None)
        if q is None or self.service.busy:
            return
        await self._answer(self.current, history(msgs[: q + 1]), self.with_chat_settings(options),
                           parent_id=msgs[q].id, replaces=tuple(m.id for m in msgs[q + 1:]))

    async def edit_and_resend(self, message_id: int, text: str, options: ReplyOptions) -> None:
        """Ask `text` instead of question `message_id`: a new sibling of it (shown at once, kept even when the
        answer fails: the user's text is never lost) with its own answer; the old question and everything that
        followed it stay one step back with ‹."""
        text = text.strip()
        msgs = self.messages()
        idx = next((i for i, m in enumerate(msgs) if m.id == message_id and m.role == "user"), None)
        if not text or idx is None or self.service.busy:
            return
        cid = self.current
        options = self.with_chat_settings(options)
        question = self.store.add_message(cid, "user", text, parent_id=msgs[idx].parent_id)
        await self._answer(cid, history(msgs[:idx]) + [{"role": "user", "content": text}], options,
                           parent_id=question)

    async def _answer(self, cid: str, messages: list[dict], options: ReplyOptions, *, parent_id: int,
                      replaces: tuple = ()) -> None:
        extra = {"skill": options.skill} if options.skill else {}
        if options.system:
            extra["system"] = options.system

        async def call(key: str):
            return await self.service.ask(messages, sampling_of(options), mode=options.mode, budget=options.budget,
                                          answer_max_tokens=options.answer_max_tokens, parallel=options.parallel,
                                          trace_key=key, **extra)

        budget = options.budget if options.mode != "base" else None
        await self._run(cid, options, call, parent_id=parent_id, replaces=replaces, budget=budget)

    def can_think_longer(self, message) -> bool:
        """A reasoning reply (it has a trace) and an engine that can reason."""
        return bool(message.role == "assistant" and message.thinking and self.service.can_reason)

    async def think_longer(self, message_id: int | None = None, extra_budget: int = 256) -> None:
        """Continue a reasoning reply's trace (by default the chat's last reply) and answer again, as a new
        sibling of the reply (its trace kept under the new message's id). The reply stays shown until the
        continuation has finished; a stopped or failed continuation leaves the shown branch as it was."""
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
        system = {"system": options.system} if options.system else {}  # the prompt the trace was made with

        async def call(key: str):
            return await self.service.think_longer(
                history(msgs[: q + 1]), target.thinking, trace_key=str(target.id), new_trace_key=key,
                extra_budget=extra_budget, budget=budget, answer_max_tokens=options.answer_max_tokens,
                sampling=sampling_of(options), **system)

        await self._run(self.current, options, call, parent_id=target.parent_id, replaces=replies,
                        thinking=target.thinking, budget=(shown or 0) + extra_budget,
                        tokens=target.meta.get("thinking_tokens", 0))

    async def _run(self, cid: str, options: ReplyOptions, call, *, parent_id: int | None, replaces: tuple = (),
                   thinking: str = "", budget: int | None = None, tokens: int = 0) -> None:
        """Stream a reply into a new row after `parent_id`: shown at once, or, as an alternative to the shown
        rows `replaces`, only once it has finished."""
        try:
            writer = ReplyWriter(self.store, cid, meta={"settings": asdict(options)}, parent_id=parent_id,
                                 activate=not replaces)
        except sqlite3.Error as err:
            self.notice.emit(f"The answer could not be started: the chat could not be saved ({err}). Free some "
                             "disk space and try again.")
            self.messagesChanged.emit()
            return
        writer.thinking = thinking
        self._writer = writer
        self.live = LiveReply(thinking=thinking, thinking_tokens=tokens, budget=budget, conversation_id=cid,
                              message_id=writer.id, parent_id=parent_id, replaces=tuple(replaces))
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
        if isinstance(event, PhaseEvent):
            stream["phase"] = event.phase
            self.liveUpdated.emit(live)
            return
        stream[event.kind] = stream.get(event.kind, "") + event.text
        stream[f"{event.kind}_tokens"] = event.index + 1  # exact counts for the per-stream rows
        if event.stream == 0:
            if event.kind == "thinking":
                live.thinking += event.text
                live.thinking_tokens = event.index + 1
            else:
                live.answer += event.text
            self._save_piece(event.text, event.kind)
        self.liveUpdated.emit(live)

    def _save_piece(self, text: str, kind: str) -> None:
        """Append streamed text to the reply's row; a failed write (disk full) is said once and the reply streams
        on in memory (the row is written whole when it finishes, if it can be)."""
        if self._write_error is not None:
            return
        try:
            self._writer.append(text, "thinking") if kind == "thinking" else self._writer.append(text)
        except sqlite3.Error as err:
            self._write_error = err
            self.notice.emit(f"The answer could not be saved while it streams ({err}). It stays on screen; copy "
                             "it if you need it, and free some disk space.")

    def _finish(self, cid: str, writer: ReplyWriter, answer, options: ReplyOptions, replaces: tuple,
                base_thinking: str) -> None:
        live, self._writer, self.live = self.live, None, None
        had_error, self._write_error = self._write_error, None
        why = getattr(self.service, "request_error", None)
        if answer is None and why and not self.service.stop_requested:
            self.replyFailed.emit(writer.id, why)
        try:
            self._store_finished(cid, writer, answer, options, replaces, base_thinking)
        except sqlite3.Error as err:
            shown = (answer.text if answer is not None else (live.answer if live else "")) or ""
            self.notice.emit(f"The answer could not be saved ({err}), so it will not be in this chat. Its text:\n\n"
                             + (shown[:4000] or "(empty)"))
        else:
            if had_error is not None:
                self.notice.emit("The answer was saved once it finished.")
        finally:
            self.conversationsChanged.emit()
            self.messagesChanged.emit()

    def _store_finished(self, cid: str, writer: ReplyWriter, answer, options: ReplyOptions, replaces: tuple,
                        base_thinking: str) -> None:
        if answer is None:  # failed (kept as incomplete), or stopped while still queued (kept as stopped)
            status = "cancelled" if self.service.stop_requested else "incomplete"
            content, thinking, meta = writer.content, writer.thinking, None
        else:
            status = "cancelled" if answer.finish_reason == "cancelled" else "complete"
            content, thinking, meta = answer.text, answer.thinking, answer_meta(answer, options)
        finished = status == "complete"
        opened = base_thinking + reasoning_prompts()["think_longer"]  # a continuation that only got its opener
        if replaces and not finished and not content.strip() and thinking in (base_thinking, opened):
            self.store.delete_messages(cid, (writer.id,))  # nothing new: drop the empty alternative's row
        else:
            writer.finish(status, content=content, thinking=thinking, meta=meta)
            if finished and replaces:
                self.store.select(cid, writer.id)  # the finished alternative is shown; the old one stays a sibling
        self.store.touch(cid)

    def pick_candidate(self, message_id: int, index: int) -> None:
        """Use another candidate's answer as the reply."""
        msg = next(m for m in self.messages() if m.id == message_id)
        cand = msg.meta["candidates"][index]
        meta = {**msg.meta, "chosen": index, "picked_by_user": True}
        self.store.update_message(message_id, content=cand["text"], thinking=cand["thinking"], meta=meta)
        self.messagesChanged.emit()
