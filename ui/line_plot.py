"""Small QPainter charts for the training wizard: LinePlot (several named series, e.g. loss, reward, length) and
BarPlot (a histogram of (lo, hi, count) bins). Both share PlotAxes: "nice" ticks with labels from the data range,
a grid and a legend, coloured from the widget's palette so they read in the light and the dark theme.
They only draw what they are given; they know nothing about training."""
from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

# Mid-saturation colours that keep their contrast on a white and on a near-black background.
SERIES_COLOURS = ("#3b82f6", "#f97316", "#10b981", "#e11d48", "#a855f7", "#eab308")


def nice_ticks(lo: float, hi: float, target: int = 5, integer: bool = False) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 × 10^k apart; whole numbers with `integer`) covering [lo, hi]; a flat
    range is widened around it."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi < lo:
        lo, hi = hi, lo
    if hi - lo < 1e-12:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = float(math.ceil(max(1.0, step)))
    first = math.floor(lo / step + 1e-9) * step
    ticks, t = [], first
    while t < hi + step * 0.999:
        ticks.append(round(t, 12))
        t += step
    if len(ticks) < 2:
        ticks.append(ticks[-1] + step)
    return ticks


def tick_label(value: float, step: float) -> str:
    """A tick value with as many decimals as the tick spacing needs (exponent form for tiny or huge values)."""
    if abs(value) < step * 1e-6:
        return "0"
    if step >= 1e4:
        return f"{value / 1e6:g}M" if step >= 1e5 else f"{value / 1e3:g}k"
    if step < 1e-4:
        return f"{value:.1e}"
    decimals = next(d for d in range(7) if abs(step * 10 ** d - round(step * 10 ** d)) < 1e-6 * 10 ** d or d == 6)
    return f"{value:.{decimals}f}"


class PlotAxes(QWidget):
    """A plot area with x/y axes, tick labels, a grid, a title and a legend; subclasses draw the data."""

    MARGIN = 8
    INTEGER_X = INTEGER_Y = False
    """Whole-number ticks (counts, token lengths)."""

    def __init__(self, parent=None, *, title: str = "", x_label: str = "", y_label: str = ""):
        super().__init__(parent)
        self.title, self.x_label, self.y_label = title, x_label, y_label
        self.setMinimumSize(240, 150)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def sizeHint(self) -> QSize:
        return QSize(420, 220)

    # --- what subclasses provide -------------------------------------------------------------------------
    def data_range(self) -> tuple[float, float, float, float] | None:
        """(x_min, x_max, y_min, y_max) of the data, or None when there is nothing to draw."""
        raise NotImplementedError

    def legend(self) -> list[tuple[str, QColor]]:
        return []

    def draw_data(self, painter: QPainter, to_px) -> None:
        raise NotImplementedError

    # --- axes --------------------------------------------------------------------------------------------
    def ticks(self) -> tuple[list[float], list[float]]:
        """The x and y tick values for the current data (what the axes show)."""
        rng = self.data_range()
        if rng is None:
            return [0.0, 1.0], [0.0, 1.0]
        x0, x1, y0, y1 = rng
        return nice_ticks(x0, x1, 5, self.INTEGER_X), nice_ticks(y0, y1, 4, self.INTEGER_Y)

    def tick_labels(self) -> tuple[list[str], list[str]]:
        xs, ys = self.ticks()
        return ([tick_label(v, xs[1] - xs[0]) for v in xs], [tick_label(v, ys[1] - ys[0]) for v in ys])

    def plot_rect(self) -> QRectF:
        """Where the data goes, inside the tick labels, title and legend."""
        fm = QFontMetrics(self.font())
        _, ylabels = self.tick_labels()
        left = self.MARGIN + max(fm.horizontalAdvance(t) for t in ylabels) + 6
        if self.y_label:
            left += fm.height() + 2
        top = self.MARGIN + (fm.height() + 4 if self.title or self.legend() else 0)
        bottom = self.MARGIN + fm.height() + 4 + (fm.height() + 2 if self.x_label else 0)
        right = self.MARGIN + fm.horizontalAdvance("0000") // 2
        return QRectF(left, top, max(10, self.width() - left - right), max(10, self.height() - top - bottom))

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        text = pal.color(QPalette.ColorRole.WindowText)
        painter.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        rect = self.plot_rect()
        xs, ys = self.ticks()
        xlabels, ylabels = self.tick_labels()
        x0, x1, y0, y1 = xs[0], xs[-1], ys[0], ys[-1]

        def to_px(x: float, y: float) -> QPointF:
            px = rect.left() + (x - x0) / (x1 - x0) * rect.width()
            py = rect.bottom() - (y - y0) / (y1 - y0) * rect.height()
            return QPointF(px, py)

        fm = QFontMetrics(self.font())
        grid = QColor(text)
        grid.setAlpha(40)
        painter.setPen(QPen(grid, 1))
        for y in ys:
            p = to_px(x0, y)
            painter.drawLine(QPointF(rect.left(), p.y()), QPointF(rect.right(), p.y()))
        painter.setPen(QPen(text, 1))
        for y, label in zip(ys, ylabels, strict=True):
            p = to_px(x0, y)
            w = fm.horizontalAdvance(label)
            painter.drawText(QPointF(rect.left() - 6 - w, p.y() + fm.ascent() / 2 - 1), label)
        for x, label in zip(xs, xlabels, strict=True):
            p = to_px(x, y0)
            painter.drawLine(QPointF(p.x(), rect.bottom()), QPointF(p.x(), rect.bottom() + 3))
            w = fm.horizontalAdvance(label)
            painter.drawText(QPointF(p.x() - w / 2, rect.bottom() + 4 + fm.ascent()), label)
        painter.drawLine(rect.bottomLeft(), rect.bottomRight())
        painter.drawLine(rect.bottomLeft(), rect.topLeft())
        if self.x_label:
            w = fm.horizontalAdvance(self.x_label)
            painter.drawText(QPointF(rect.center().x() - w / 2, self.height() - self.MARGIN - fm.descent()), self.x_label)
        if self.y_label:
            painter.save()
            painter.translate(self.MARGIN + fm.ascent(), rect.center().y() + fm.horizontalAdvance(self.y_label) / 2)
            painter.rotate(-90)
            painter.drawText(QPointF(0, 0), self.y_label)
            painter.restore()
        if self.title:
            painter.drawText(QPointF(rect.left(), self.MARGIN + fm.ascent()), self.title)
        self._draw_legend(painter, fm, rect)
        painter.save()
        painter.setClipRect(rect.adjusted(-2, -2, 2, 2))
        if self.data_range() is not None:
            self.draw_data(painter, to_px)
        painter.restore()
        painter.end()

    def _draw_legend(self, painter: QPainter, fm: QFontMetrics, rect: QRectF) -> None:
        x = rect.right()
        for name, colour in reversed(self.legend()):
            w = fm.horizontalAdvance(name)
            x -= w
            painter.setPen(QPen(self.palette().color(QPalette.ColorRole.WindowText)))
            painter.drawText(QPointF(x, self.MARGIN + fm.ascent()), name)
            x -= 16
            painter.setPen(QPen(colour, 3))
            mid = self.MARGIN + fm.ascent() - fm.xHeight() / 2
            painter.drawLine(QPointF(x, mid), QPointF(x + 12, mid))
            x -= 12


class LinePlot(PlotAxes):
    """Named series of (x, y) points, appended live; each series gets its own colour and a legend entry."""

    def __init__(self, parent=None, **kwargs):
        super().__init__(parent, **kwargs)
        self._series: dict[str, list[tuple[float, float]]] = {}
        self._colours: dict[str, QColor] = {}

    def add_series(self, name: str, colour: str | None = None) -> None:
        if name not in self._series:
            self._series[name] = []
            self._colours[name] = QColor(colour or SERIES_COLOURS[len(self._colours) % len(SERIES_COLOURS)])

    def append(self, name: str, x: float, y: float) -> None:
        """Add one point (a new series is created on first use); non-finite values are skipped."""
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
            return
        self.add_series(name)
        self._series[name].append((float(x), float(y)))
        self.update()

    def points(self, name: str) -> list[tuple[float, float]]:
        return list(self._series.get(name, []))

    def series_names(self) -> list[str]:
        return list(self._series)

    def clear(self) -> None:
        for pts in self._series.values():
            pts.clear()
        self.update()

    def data_range(self):
        pts = [p for s in self._series.values() for p in s]
        if not pts:
            return None
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        return min(xs), max(xs), min(ys), max(ys)

    def legend(self):
        return [(name, self._colours[name]) for name in self._series] if len(self._series) > 1 else []

    def draw_data(self, painter: QPainter, to_px) -> None:
        for name, pts in self._series.items():
            if not pts:
                continue
            colour = self._colours[name]
            painter.setPen(QPen(colour, 2))
            if len(pts) == 1:
                painter.setBrush(colour)
                painter.drawEllipse(to_px(*pts[0]), 3, 3)
                continue
            path = QPainterPath(to_px(*pts[0]))
            for p in pts[1:]:
                path.lineTo(to_px(*p))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawPath(path)


class BarPlot(PlotAxes):
    """A histogram: bars over (lo, hi) bins with a count each (e.g. core.data.train.token_histogram)."""

    INTEGER_X = INTEGER_Y = True

    def __init__(self, parent=None, *, colour: str = SERIES_COLOURS[0], **kwargs):
        super().__init__(parent, **kwargs)
        self._bins: list[tuple[float, float, int]] = []
        self._colour = QColor(colour)

    def set_bins(self, bins) -> None:
        # a bin of one value (every record the same length) still gets a visible width
        self._bins = [(float(lo), float(max(hi, lo + 1)), int(n)) for lo, hi, n in bins]
        self.update()

    def bins(self) -> list[tuple[float, float, int]]:
        return list(self._bins)

    def data_range(self):
        if not self._bins:
            return None
        return self._bins[0][0], max(hi for _, hi, _ in self._bins), 0.0, max(1, max(n for *_, n in self._bins))

    def draw_data(self, painter: QPainter, to_px) -> None:
        fill = QColor(self._colour)
        fill.setAlpha(190)
        painter.setPen(QPen(self._colour, 1))
        painter.setBrush(fill)
        for lo, hi, n in self._bins:
            if n <= 0:
                continue
            top_left, bottom_right = to_px(lo, n), to_px(max(hi, lo + 1e-9), 0)
            painter.drawRect(QRectF(top_left, bottom_right).adjusted(1, 0, -1, 0))
