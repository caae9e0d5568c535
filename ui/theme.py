"""Light and dark themes: Qt's Fusion style, an explicit palette and one app-wide stylesheet (spacing, rounded
inputs, buttons, lists and cards, hairline rules in a soft colour — never black, and never white in the dark
theme). 'system' follows the OS colour scheme, also when it changes while Ponder runs; 'light'/'dark' force
one. Explicit palettes, so every platform (offscreen included) gets the same colours.

Widgets opt into the shell's looks by object name: `primary` (the main button), `card` (a clickable card),
`muted` (secondary text), `chip` (a compact control), `chatHeader`, `welcome`."""
from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QImage, QPainter, QPalette, QPolygonF
from PySide6.QtWidgets import QApplication

R = QPalette.ColorRole
DARK = {
    R.Window: "#202124", R.WindowText: "#e8eaed", R.Base: "#17181a", R.AlternateBase: "#26272b",
    R.Text: "#e8eaed", R.Button: "#2b2c30", R.ButtonText: "#e8eaed", R.Highlight: "#4f7dd9",
    R.HighlightedText: "#ffffff", R.Link: "#8ab4f8", R.ToolTipBase: "#2b2c30", R.ToolTipText: "#e8eaed",
    R.PlaceholderText: "#9aa0a6", R.BrightText: "#ff6b6b",
    # the roles Fusion draws bevels, frames and rules with: left at their defaults they are white / black
    R.Light: "#3a3c41", R.Midlight: "#313337", R.Mid: "#2a2b2f", R.Dark: "#1b1c1f", R.Shadow: "#111214",
}
LIGHT = {R.Highlight: "#3b6fd8", R.Link: "#2f5fc4", R.Shadow: "#9aa0a6", R.Dark: "#b9bcc2"}

COLOURS = {
    "light": {"window": "#f7f7f8", "base": "#ffffff", "surface": "#ffffff", "raised": "#f1f2f4",
              "border": "#dcdde1", "hover": "#eceef1", "selected": "#dbe6fb", "text": "#1f2328",
              "muted": "#6b7280", "accent": "#3b6fd8", "on_accent": "#ffffff", "scroll": "#c4c7cc"},
    "dark": {"window": "#202124", "base": "#17181a", "surface": "#26272b", "raised": "#2b2c30",
             "border": "#3a3c41", "hover": "#303236", "selected": "#2d3f63", "text": "#e8eaed",
             "muted": "#9aa0a6", "accent": "#4f7dd9", "on_accent": "#ffffff", "scroll": "#4a4d53"},
}

STYLESHEET = """
QMainWindow, QDialog {{ background: {window}; }}
QSplitter::handle {{ background: {border}; }}
QSplitter::handle:horizontal {{ width: 1px; }}
QSplitter::handle:vertical {{ height: 1px; }}
QLineEdit, QPlainTextEdit, QTextEdit, QSpinBox, QDoubleSpinBox, QComboBox {{
    border: 1px solid {border}; border-radius: 8px; padding: 4px 8px; background: {base}; color: {text};
    selection-background-color: {accent}; selection-color: {on_accent}; }}
QLineEdit:focus, QPlainTextEdit:focus, QTextEdit:focus, QSpinBox:focus, QDoubleSpinBox:focus,
QComboBox:focus {{ border: 1px solid {accent}; }}
QLineEdit:disabled, QPlainTextEdit:disabled, QSpinBox:disabled, QDoubleSpinBox:disabled, QComboBox:disabled {{
    color: {muted}; background: {raised}; }}
QComboBox {{ padding-right: 22px; }}
QComboBox::drop-down {{ subcontrol-origin: padding; subcontrol-position: center right; border: none; width: 20px; }}
QComboBox::down-arrow {{ image: url({arrow_down}); width: 9px; height: 6px; }}
QComboBox::down-arrow:disabled {{ image: url({arrow_down_off}); }}
QSpinBox, QDoubleSpinBox {{ padding-right: 20px; }}
QSpinBox::up-button, QDoubleSpinBox::up-button {{ subcontrol-origin: border; subcontrol-position: top right;
    width: 18px; border: none; background: transparent; margin-top: 3px; }}
QSpinBox::down-button, QDoubleSpinBox::down-button {{ subcontrol-origin: border; subcontrol-position: bottom right;
    width: 18px; border: none; background: transparent; margin-bottom: 3px; }}
QSpinBox::up-arrow, QDoubleSpinBox::up-arrow {{ image: url({arrow_up}); width: 8px; height: 5px; }}
QSpinBox::down-arrow, QDoubleSpinBox::down-arrow {{ image: url({arrow_down}); width: 8px; height: 5px; }}
QSpinBox::up-arrow:disabled, QDoubleSpinBox::up-arrow:disabled {{ image: url({arrow_up_off}); }}
QSpinBox::down-arrow:disabled, QDoubleSpinBox::down-arrow:disabled {{ image: url({arrow_down_off}); }}
QSpinBox::up-button:hover, QSpinBox::down-button:hover, QDoubleSpinBox::up-button:hover,
QDoubleSpinBox::down-button:hover {{ background: {hover}; }}
QComboBox QAbstractItemView {{ border: 1px solid {border}; background: {surface}; color: {text};
    selection-background-color: {selected}; selection-color: {text}; outline: 0; }}
QPushButton {{ border: 1px solid {border}; border-radius: 8px; padding: 5px 12px; background: {surface};
    color: {text}; }}
QToolButton {{ border: 1px solid transparent; border-radius: 6px; padding: 3px; background: transparent;
    color: {text}; }}
QPushButton:hover, QToolButton:hover {{ background: {hover}; border: 1px solid {border}; }}
QPushButton:pressed, QToolButton:pressed, QToolButton:checked {{ background: {selected}; }}
QPushButton:disabled, QToolButton:disabled {{ color: {muted}; }}
QPushButton#primary {{ background: {accent}; color: {on_accent}; border: 1px solid {accent}; }}
QPushButton#primary:disabled {{ background: {raised}; color: {muted}; border: 1px solid {border}; }}
QToolButton#chip {{ border: 1px solid {border}; border-radius: 13px; padding: 3px 12px; background: {surface}; }}
QToolButton#chip:hover {{ background: {hover}; }}
QListWidget, QTreeWidget, QTableWidget, QTableView, QListView {{
    border: 1px solid {border}; border-radius: 8px; background: {base}; color: {text}; outline: 0; }}
QTextBrowser {{ border: none; padding: 0; background: transparent; }}
QListWidget::item {{ padding: 6px 8px; border-radius: 6px; }}
QListWidget::item:hover {{ background: {hover}; }}
QListWidget::item:selected {{ background: {selected}; color: {text}; }}
QHeaderView::section {{ background: {raised}; color: {text}; border: none; border-bottom: 1px solid {border};
    padding: 4px 8px; }}
QTableCornerButton::section {{ background: {raised}; border: none; }}
QGroupBox {{ border: 1px solid {border}; border-radius: 8px; margin-top: 14px; padding: 10px 8px 8px 8px; }}
QGroupBox::title {{ subcontrol-origin: margin; left: 10px; padding: 0 4px; color: {muted}; }}
QTabWidget::pane {{ border: 1px solid {border}; border-radius: 8px; top: -1px; }}
QTabBar::tab {{ padding: 6px 14px; border: 1px solid transparent; border-top-left-radius: 8px;
    border-top-right-radius: 8px; color: {muted}; }}
QTabBar::tab:selected {{ border: 1px solid {border}; border-bottom-color: {window}; color: {text}; }}
QMenuBar {{ background: {window}; border-bottom: 1px solid {border}; }}
QMenuBar::item {{ padding: 4px 10px; border-radius: 6px; }}
QMenuBar::item:selected {{ background: {hover}; }}
QMenu {{ background: {surface}; color: {text}; border: 1px solid {border}; border-radius: 8px; padding: 4px; }}
QMenu::item {{ padding: 5px 22px 5px 14px; border-radius: 6px; }}
QMenu::item:selected {{ background: {hover}; }}
QMenu::separator {{ height: 1px; background: {border}; margin: 4px 8px; }}
QStatusBar {{ background: {window}; border-top: 1px solid {border}; color: {muted}; }}
QStatusBar::item {{ border: none; }}
QProgressBar {{ border: 1px solid {border}; border-radius: 6px; background: {raised}; color: {text};
    text-align: center; min-height: 14px; }}
QProgressBar::chunk {{ background: {accent}; border-radius: 5px; }}
QToolTip {{ background: {surface}; color: {text}; border: 1px solid {border}; border-radius: 6px; padding: 4px; }}
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 2px; border: none; }}
QScrollBar:horizontal {{ background: transparent; height: 10px; margin: 2px; border: none; }}
QScrollBar::handle:vertical, QScrollBar::handle:horizontal {{ background: {scroll}; border-radius: 3px;
    min-height: 24px; min-width: 24px; }}
QScrollBar::add-line, QScrollBar::sub-line {{ width: 0; height: 0; border: none; }}
QScrollBar::add-page, QScrollBar::sub-page {{ background: transparent; }}
QLabel#muted {{ color: {muted}; }}
QWidget#chatHeader {{ border-bottom: 1px solid {border}; }}
QFrame#card {{ border: 1px solid {border}; border-radius: 10px; background: {surface}; }}
QFrame#card:hover {{ border: 1px solid {accent}; background: {hover}; }}
QWidget#welcome {{ background: {base}; }}
"""


def os_prefers_dark(app: QApplication) -> bool:
    return app.styleHints().colorScheme() == Qt.ColorScheme.Dark


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in DARK.items():
        palette.setColor(role, QColor(colour))
    for role in (R.Text, R.ButtonText, R.WindowText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6f7378"))
    return palette


def light_palette(app: QApplication) -> QPalette:
    palette = app.style().standardPalette()
    for role, colour in LIGHT.items():
        palette.setColor(role, QColor(colour))
    return palette


@cache
def _arrow_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="ponder-theme-"))


def arrow(direction: str, colour: str) -> str:
    """A small triangle image ('up' or 'down') in `colour`, for combo box and spin box arrows (a stylesheet
    draws no arrow of its own once a box is styled); its path, written once per process."""
    path = _arrow_dir() / f"{direction}-{colour.lstrip('#')}.png"
    if not path.exists():
        image = QImage(18, 12, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(colour))
        points = [(1, 1), (17, 1), (9, 11)] if direction == "down" else [(1, 11), (17, 11), (9, 1)]
        painter.drawPolygon(QPolygonF([QPointF(x, y) for x, y in points]))
        painter.end()
        image.save(str(path))
    return path.as_posix()


def stylesheet(mode: str) -> str:
    """The app-wide stylesheet for 'light' or 'dark'."""
    c = COLOURS[mode]
    arrows = {"arrow_down": arrow("down", c["muted"]), "arrow_up": arrow("up", c["muted"]),
              "arrow_down_off": arrow("down", c["border"]), "arrow_up_off": arrow("up", c["border"])}
    return STYLESHEET.format(**c, **arrows)


def resolved(theme: str, app: QApplication) -> str:
    """'light' or 'dark': what `theme` means on this system now."""
    if theme == "system":
        return "dark" if os_prefers_dark(app) else "light"
    return theme


def current_mode(app: QApplication | None = None) -> str:
    """The mode applied last ('light' until a theme is applied)."""
    app = app or QApplication.instance()
    return app.property("ponder_mode") or "light"


def apply_theme(theme: str, app: QApplication | None = None) -> str:
    """Apply 'system', 'light' or 'dark' (palette and stylesheet); returns the resolved 'light' or 'dark'."""
    app = app or QApplication.instance()
    app.setStyle("Fusion")
    mode = resolved(theme, app)
    app.setPalette(dark_palette() if mode == "dark" else light_palette(app))
    if app.property("ponder_mode") != mode or not app.styleSheet():
        app.setStyleSheet(stylesheet(mode))  # re-polishes every widget: only when it changes
    app.setProperty("ponder_theme", theme)
    app.setProperty("ponder_mode", mode)
    return mode


def set_text_size(widget, points: int) -> None:
    """`widget` and everything inside it at `points` pt. A widget stylesheet, not only setFont: under the
    app stylesheet a polish (first show, theme change) resets a widget's font to its parent's."""
    font = widget.font()
    font.setPointSize(points)
    widget.setFont(font)
    widget.setStyleSheet(f"font-size: {points}pt;")


def follow_system(app: QApplication) -> None:
    """Re-apply the theme when the OS switches light/dark, if the user chose 'system'."""
    def changed(_scheme) -> None:
        if app.property("ponder_theme") == "system":
            apply_theme("system", app)

    app.styleHints().colorSchemeChanged.connect(changed)
