"""The transcript: messages as Markdown (code blocks with copy links), per-answer thinking trace with its
meter and budget marker, answer details, parallel candidates with score bars and the vote, and actions
(copy, regenerate, edit, think longer, pick a candidate) as `ponder:` links. Auto-scroll stops when the
user scrolls up."""
from __future__ import annotations

import re
import time

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QTextBrowser

FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)


def escape(text: str) -> str:
    """User and model text is shown, never interpreted as HTML."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def quote(text: str) -> str:
    return "\n".join("> " + line for line in escape(text).splitlines()) or "> …"


def bar(score: float | None, width: int = 10) -> str:
    if score is None:
        return "—"
    filled = round(score * width)
    return "█" * filled + "░" * (width - filled) + f" {score:.2f}"


class ChatView(QTextBrowser):
    action = Signal(str, list)
    """(verb, args) from a clicked ponder: link, e.g. ('pick', [message_id, index])."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._clicked)
        self.expanded: set[int] = set()
        self.code_blocks: dict[str, str] = {}

    def _clicked(self, url) -> None:
        verb, *args = url.toString().removeprefix("ponder:").split("/")
        if verb == "toggle":
            mid = int(args[0])
            self.expanded.symmetric_difference_update({mid})
        self.action.emit(verb, args)

    def _code_links(self, mid, text: str) -> str:
        out, k = [], 0

        def repl(m):
            nonlocal k
            key = f"{mid}-{k}"
            self.code_blocks[key] = m.group(1)
            k += 1
            return m.group(0) + f"\n[Copy code](ponder:copycode/{key})\n"

        out.append(FENCE.sub(repl, text))
        return "".join(out)

    def render(self, messages, live=None, busy: bool = False, can_reason: bool = False) -> None:
        """`live`: the reply streaming in this chat (its stored row is shown through it); `can_reason`: whether
        the engine can think longer."""
        scroll = self.verticalScrollBar()
        at_bottom = scroll.value() >= scroll.maximum() - 4
        keep = scroll.value()
        parts = []
        streaming = getattr(live, "message_id", None)
        messages = [m for m in messages if m.id != streaming]
        last_assistant = max((m.id for m in messages if m.role == "assistant"), default=None)
        for m in messages:
            if m.role == "user":
                parts.append(f"**You**\n\n{self._code_links(m.id, escape(m.content))}\n\n[Edit](ponder:edit/{m.id})")
            else:
                parts.append(self._assistant(m, m.id == last_assistant and not busy, can_reason))
        if live is not None:
            parts.append(self._live(live))
        self.setMarkdown("\n\n---\n\n".join(parts) if parts else "*Start a conversation below.*")
        scroll.setValue(scroll.maximum() if at_bottom else keep)

    def _thinking_header(self, tokens: int, budget, forced: bool, seconds: float | None = None) -> str:
        meter = f"{tokens}/{budget} tokens" if budget else f"{tokens} tokens"
        cut = " · **cut at budget**" if forced else ""
        secs = f" · {seconds:.1f}s" if seconds is not None else ""
        return f"*Thinking — {meter}{cut}{secs}*"

    def _assistant(self, m, is_last: bool, can_reason: bool = False) -> str:
        meta = m.meta
        lines = ["**Ponder**"]
        reasoned = bool((meta.get("route") or {}).get("reason"))
        if m.thinking or reasoned:
            header = self._thinking_header(meta.get("thinking_tokens", 0), meta.get("budget"), meta.get("budget_forced"))
            show = "▾ hide trace" if m.id in self.expanded else "▸ show trace"
            lines.append(f"{header} [{show}](ponder:toggle/{m.id})")
            if m.id in self.expanded:
                lines.append(quote(m.thinking))
        status = {"incomplete": "\n\n*(incomplete: the answer stopped before it finished)*",
                  "cancelled": "\n\n*(stopped)*"}.get(m.status, "")
        lines.append(self._code_links(m.id, escape(m.content)) + status)
        if meta.get("candidates"):
            lines.append(self._candidates(m))
        acts = [f"[Copy](ponder:copy/{m.id})", f"[Details](ponder:details/{m.id})"]
        if is_last:
            acts.append("[Regenerate](ponder:regen)")
            if m.thinking and can_reason:  # only a reasoning reply has a trace to continue
                acts.append(f"[Think longer](ponder:longer/{m.id})")
        lines.append(" · ".join(acts))
        return "\n\n".join(lines)

    def _candidates(self, m) -> str:
        meta = m.meta
        vote = meta.get("vote", {})
        table = vote.get("table", [])
        undecided = bool(vote.get("tie")) and not meta.get("picked_by_user")  # a tie picked nobody
        rows = ["| # | answer | verifier | |", "|---|---|---|---|"]
        for c in meta["candidates"]:
            if c["index"] == meta.get("chosen"):
                mark = "*shown (tie)*" if undecided else "**✓**"
            else:
                mark = f"[use](ponder:pick/{m.id}/{c['index']})"
            rows.append(f"| {c['index'] + 1} | {escape(str(c['answer']))} | {bar(c['score'])} | {mark} |")
        total = sum(w for _, w, _ in table) or 1
        chart = ["", f"Vote ({vote.get('method', '?')}){tie_note(vote, undecided)}:"] + [
            f"- `{escape(str(a))}` {'▇' * max(1, round(12 * w / total))} {w:.2f} ({n} vote{'s' if n != 1 else ''})"
            for a, w, n in table]
        return "\n".join(rows + chart)

    def _live(self, live) -> str:
        lines = ["**Ponder**"]
        if getattr(live, "replaces", ()):
            lines.append("*The earlier answer stays until this one has finished.*")
        elapsed = time.monotonic() - live.started
        if live.thinking or live.budget:
            lines.append(self._thinking_header(live.thinking_tokens, live.budget, False, elapsed))
            lines.append(quote(live.thinking[-2000:]))
        if len(live.streams) > 1:
            lines.append(f"*{len(live.streams)} answers in parallel…*")
        lines.append(escape(live.answer) + "▌")
        return "\n\n".join(lines)


def tie_note(vote: dict, undecided: bool) -> str:
    """' — tie between 4 answers (1 vote each): the first candidate is shown' when the vote picked nobody."""
    if not vote.get("tie"):
        return ""
    table, method = vote.get("table", []), vote.get("method")
    if not undecided:
        return " — tie; your pick is shown"
    if table and method == "majority":
        n, votes = sum(1 for r in table if r[2] == table[0][2]), table[0][2]
        what = f" between {n} answers ({votes} vote{'s' if votes != 1 else ''} each)"
    elif table and method == "weighted":
        n = sum(1 for r in table if abs(r[1] - table[0][1]) < 1e-9)
        what = f" between {n} answers (weight {table[0][1]:.2f} each)"
    else:
        what = ""
    return f" — **tie**{what}: the first candidate is shown"


def details_text(m) -> str:
    meta = m.meta
    route = meta.get("route") or {}
    prob = route.get("probability")
    lines = [
        f"Route: {'reasoning' if route.get('reason') else 'direct answer'} "
        f"({route.get('source', '?')}{f', p={prob:.2f}' if prob is not None else ''})",
        f"Adapter: {meta.get('adapter') or 'none'}",
        f"Thinking tokens: {meta.get('thinking_tokens', 0)} / budget {meta.get('budget') or '—'}"
        f"{' (cut)' if meta.get('budget_forced') else ''}",
        f"Answer tokens: {meta.get('answer_tokens', 0)}",
        f"TTFT: {meta.get('ttft_s', 0):.2f} s · {meta.get('decode_tok_s', 0):.1f} tok/s",
        f"Model: {meta.get('model', '?')} · weights {meta.get('precision', '?')} · KV {meta.get('kv', '?')}",
    ]
    if meta.get("resumed"):
        how = "on the kept trace" if meta["resumed"] == "cache" else "on the trace rebuilt from its text"
        lines.append(f"Thought longer {how}")
    return "\n".join(lines)
