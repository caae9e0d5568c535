"""LinePlot and BarPlot: what is appended is drawn inside the plot area, the axes follow the data range, and the
data stays visible on the light and the dark palette."""
import pytest
from PySide6.QtGui import QColor, QPalette

from ui.line_plot import SERIES_COLOURS, BarPlot, LinePlot, nice_ticks, tick_label
from ui.theme import dark_palette


def coloured_pixels(widget, colour: str, tolerance: int = 40) -> int:
    """How many pixels inside the plot area are close to `colour` (the data, not the axes or text)."""
    img = widget.grab().toImage()
    rect = widget.plot_rect().toRect().adjusted(2, 2, -2, -2)
    target = QColor(colour)
    ratio = img.width() / widget.width()
    n = 0
    for x in range(int(rect.left() * ratio), int(rect.right() * ratio), 2):
        for y in range(int(rect.top() * ratio), int(rect.bottom() * ratio), 2):
            c = img.pixelColor(x, y)
            if (abs(c.red() - target.red()) + abs(c.green() - target.green())
                    + abs(c.blue() - target.blue())) < tolerance:
                n += 1
    return n


def make_plot(qtbot, palette=None, cls=LinePlot, **kwargs):
    plot = cls(**kwargs)
    if palette is not None:
        plot.setPalette(palette)
    plot.resize(400, 220)
    qtbot.addWidget(plot)
    return plot


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 97) == [0, 20, 40, 60, 80, 100]
    ticks = nice_ticks(1.2, 3.7)
    assert ticks[0] <= 1.2 and ticks[-1] >= 3.7 and ticks[1] - ticks[0] == pytest.approx(0.5)
    flat = nice_ticks(5, 5)
    assert flat[0] < 5 < flat[-1]
    assert [tick_label(v, 0.0005) for v in (0.0, 0.001)] == ["0", "0.0010"]
    assert tick_label(250000, 250000) == "0.25M" and tick_label(40000, 20000) == "40k"


@pytest.mark.parametrize("dark", [False, True])
def test_appended_series_are_drawn_in_their_colours(qtbot, dark):
    plot = make_plot(qtbot, dark_palette() if dark else None, title="loss", x_label="step")
    assert coloured_pixels(plot, SERIES_COLOURS[0]) == 0
    for step in range(1, 21):
        plot.append("train", step, 3.0 / step)
    assert coloured_pixels(plot, SERIES_COLOURS[0]) > 10
    assert coloured_pixels(plot, SERIES_COLOURS[1]) == 0
    for step in range(1, 21):
        plot.append("held-out", step, 2.0 + 0.01 * step)
    assert plot.series_names() == ["train", "held-out"]
    assert coloured_pixels(plot, SERIES_COLOURS[1]) > 10
    # the background follows the palette: white-ish on light, near-black on dark
    bg = plot.grab().toImage().pixelColor(2, 2)
    assert (bg.lightness() < 60) if dark else (bg.lightness() > 200)
    assert bg == plot.palette().color(QPalette.ColorRole.Base)


def test_axes_labels_follow_the_data_range(qtbot):
    plot = make_plot(qtbot)
    plot.append("loss", 0, 0.5)
    plot.append("loss", 40, 2.4)
    xs, ys = plot.tick_labels()
    assert xs[0] == "0" and xs[-1] == "40"
    assert float(ys[0]) <= 0.5 and float(ys[-1]) >= 2.4 and float(ys[-1]) < 3.5
    plot.append("loss", 400, 120.0)
    xs, ys = plot.tick_labels()
    assert xs[-1] == "400" and float(ys[-1]) >= 120
    plot.append("loss", 500, float("nan"))  # a diverged step is skipped, not drawn as a spike to nowhere
    assert len(plot.points("loss")) == 3


def test_bar_plot_draws_a_histogram(qtbot):
    plot = make_plot(qtbot, cls=BarPlot, x_label="tokens", y_label="records")
    assert coloured_pixels(plot, SERIES_COLOURS[0]) == 0
    plot.set_bins([(0, 50, 3), (50, 100, 7), (100, 150, 0), (150, 200, 1)])
    assert coloured_pixels(plot, SERIES_COLOURS[0], tolerance=90) > 50
    xs, ys = plot.tick_labels()
    assert xs[0] == "0" and float(xs[-1]) >= 200 and float(ys[-1]) >= 7
