"""The vote of parallel answers: a QPainter bar chart (one bar per distinct answer, split into one segment per
candidate, each coloured by its verifier score, the winner marked with ✓, tied leaders marked "tie") and the
candidate list with a "Use this" button each (verb `pick`). Geometry is computed apart from painting, so
tests and the accessible description see what is drawn."""
from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPalette, QPen
from PySide6.QtWidgets import QGridLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

ROW_H, GAP, LABEL_W, VALUE_W, PAD = 22, 8, 120, 96, 6


def score_colour(score: float | None) -> QColor:
    """Red (0) → amber → green (1); grey without a verifier score."""
    if score is None:
        return QColor("#9aa0a6")
    return QColor.fromHsvF(max(0.0, min(1.0, score)) * 0.33, 0.62, 0.86)


@dataclass
class Bar:
    answer: str
    weight: float
    votes: int
    candidates: list[dict]
    winner: bool = False
    tie: bool = False
    rect: QRectF = field(default_factory=QRectF)
    segments: list[tuple[QRectF, int, QColor]] = field(default_factory=list)
    """(rect, candidate index, colour) per candidate, left to right."""


def answer_key(answer) -> str:
    return "no answer" if answer is None else str(answer)


def bars_of(meta: dict) -> list[Bar]:
    """One bar per distinct answer, in the vote table's order (strongest first)."""
    cands = meta.get("candidates") or []
    vote = meta.get("vote") or {}
    table = vote.get("table") or []
    groups: dict[str, list[dict]] = {}
    for c in cands:
        groups.setdefault(answer_key(c.get("answer")), []).append(c)
    weighted = vote.get("method") == "weighted"
    bars, seen = [], set()
    for answer, weight, votes in table:
        key = answer_key(answer)
        if key in groups and key not in seen:
            seen.add(key)
            bars.append(Bar(key, float(weight), int(votes), groups[key]))
    for key, group in groups.items():  # answers the table left out (e.g. no extracted answer)
        if key not in seen:
            weight = sum((c.get("score") or 0.0) if weighted else 1.0 for c in group)
            bars.append(Bar(key, float(weight), len(group), group))
    chosen = meta.get("chosen")
    undecided = bool(vote.get("tie")) and not meta.get("picked_by_user")  # a tie picked nobody
    winner = None if undecided else next((answer_key(c.get("answer")) for c in cands if c.get("index") == chosen), None)
    top = max((b.weight for b in bars), default=0.0)
    leaders = [b for b in bars if abs(b.weight - top) < 1e-9]
    tie = bool(vote.get("tie")) or len(leaders) > 1
    for b in bars:
        b.winner = b.answer == winner
        b.tie = tie and len(leaders) > 1 and b in leaders
    return bars


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
    return f" — tie{what}: the first candidate is shown"


class VoteChart(QWidget):
    """The bar chart itself."""

    def __init__(self, meta: dict, parent=None):
        super().__init__(parent)
        self.meta = meta
        self.weighted = (meta.get("vote") or {}).get("method") == "weighted"
        self.bars = bars_of(meta)
        self.setMinimumWidth(LABEL_W + VALUE_W + 80)
        self.setFixedHeight(PAD * 2 + len(self.bars) * (ROW_H + GAP))
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Vote chart")
        self.setAccessibleDescription("; ".join(
            f"{b.answer}: {b.weight:.2f} ({b.votes} vote{'s' if b.votes != 1 else ''})"
            f"{' — winner' if b.winner else ''}{' — tie' if b.tie else ''}" for b in self.bars))
        self.layout_bars(self.width())

    def layout_bars(self, width: int) -> list[Bar]:
        """Place every bar and segment for a chart `width` pixels wide."""
        span = max(20.0, width - LABEL_W - VALUE_W - 2 * PAD)
        top = max((b.weight for b in self.bars), default=0.0) or 1.0
        for row, b in enumerate(self.bars):
            y = PAD + row * (ROW_H + GAP)
            length = span * (b.weight / top if b.weight > 0 else 0.0)
            b.rect = QRectF(PAD + LABEL_W, y, max(length, 3.0), ROW_H)
            parts = [max((c.get("score") or 0.0) if self.weighted else 1.0, 1e-6) for c in b.candidates]
            total, x = sum(parts), b.rect.left()
            b.segments = []
            for c, part in zip(b.candidates, parts, strict=True):
                w = b.rect.width() * part / total
                b.segments.append((QRectF(x, y, w, ROW_H), int(c.get("index", 0)), score_colour(c.get("score"))))
                x += w
        return self.bars

    def resizeEvent(self, event) -> None:
        self.layout_bars(self.width())
        super().resizeEvent(event)

    def paintEvent(self, _event) -> None:
        bars = self.layout_bars(self.width())
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        text, edge = pal.color(QPalette.ColorRole.Text), pal.color(QPalette.ColorRole.Window)
        fm = QFontMetrics(self.font())
        for b in bars:
            label = QRectF(PAD, b.rect.top(), LABEL_W - 8, ROW_H)
            p.setPen(text)
            p.drawText(label, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                       fm.elidedText(b.answer, Qt.TextElideMode.ElideRight, LABEL_W - 8))
            for rect, _index, colour in b.segments:
                p.setPen(QPen(edge, 1.5))
                p.setBrush(colour)
                p.drawRoundedRect(rect, 4, 4)
            if b.winner or b.tie:
                pen = QPen(pal.color(QPalette.ColorRole.Highlight) if b.winner else text, 2.0)
                if b.tie:
                    pen.setStyle(Qt.PenStyle.DashLine)
                p.setPen(pen)
                p.setBrush(Qt.BrushStyle.NoBrush)
                p.drawRoundedRect(b.rect.adjusted(-2, -2, 2, 2), 5, 5)
            value = f"{b.weight:.2f}" if self.weighted else f"{b.votes} vote{'s' if b.votes != 1 else ''}"
            mark = (" ✓" if b.winner else "") + (" tie" if b.tie else "")
            p.setPen(text)
            p.drawText(QRectF(b.rect.right() + 8, b.rect.top(), VALUE_W, ROW_H),
                       Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, value + mark)
        p.end()


class VotePanel(QWidget):
    """Title with the method and any tie, the chart, and the candidates with "Use this"."""

    action = Signal(str, list)

    def __init__(self, message_id: int, meta: dict, parent=None):
        super().__init__(parent)
        vote = meta.get("vote") or {}
        undecided = bool(vote.get("tie")) and not meta.get("picked_by_user")
        self.title = QLabel(f"Vote ({vote.get('method', '?')}){tie_note(vote, undecided)}")
        self.title.setWordWrap(True)
        self.chart = VoteChart(meta)
        self.buttons: dict[int, QPushButton] = {}
        self.rows: list[str] = []
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        for row, c in enumerate(meta.get("candidates") or []):
            score = c.get("score")
            grid.addWidget(QLabel(f"#{c['index'] + 1}"), row, 0)
            answer = QLabel(answer_key(c.get("answer")))
            answer.setTextFormat(Qt.TextFormat.PlainText)
            grid.addWidget(answer, row, 1)
            grid.addWidget(QLabel("verifier —" if score is None else f"verifier {score:.2f}"), row, 2)
            shown = c["index"] == meta.get("chosen")
            mark = ("shown (tie)" if undecided else "✓ shown") if shown else "use this"
            self.rows.append(f"#{c['index'] + 1} {answer.text()} · verifier "
                             f"{'—' if score is None else f'{score:.2f}'} · {mark}")
            if shown:
                grid.addWidget(QLabel(mark), row, 3)
            else:
                button = QPushButton("Use this")
                button.setAccessibleName(f"Use answer {c['index'] + 1}")
                button.setToolTip("Show this candidate as the reply")
                button.clicked.connect(lambda _=False, i=c["index"]: self.action.emit("pick", [str(message_id), str(i)]))
                grid.addWidget(button, row, 3)
                self.buttons[c["index"]] = button
        grid.setColumnStretch(1, 1)
        box = QVBoxLayout(self)
        box.setContentsMargins(8, 4, 8, 4)
        box.addWidget(self.title)
        box.addWidget(self.chart)
        box.addLayout(grid)

    def plain_text(self) -> str:
        return "\n".join([self.title.text(), self.chart.accessibleDescription(), *self.rows])
