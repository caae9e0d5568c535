"""Light and dark themes on Qt's Fusion style. 'system' follows the OS colour scheme, also when it changes
while Ponder runs; 'light'/'dark' force one. Explicit palettes, so every platform (offscreen included)
gets the same colours."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

DARK = {
    QPalette.ColorRole.Window: "#202124", QPalette.ColorRole.WindowText: "#e8eaed",
    QPalette.ColorRole.Base: "#17181a", QPalette.ColorRole.AlternateBase: "#26272b",
    QPalette.ColorRole.Text: "#e8eaed", QPalette.ColorRole.Button: "#2b2c30",
    QPalette.ColorRole.ButtonText: "#e8eaed", QPalette.ColorRole.Highlight: "#4f7dd9",
    QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.Link: "#8ab4f8",
    QPalette.ColorRole.ToolTipBase: "#2b2c30", QPalette.ColorRole.ToolTipText: "#e8eaed",
    QPalette.ColorRole.PlaceholderText: "#9aa0a6", QPalette.ColorRole.BrightText: "#ff6b6b",
}


def os_prefers_dark(app: QApplication) -> bool:
    return app.styleHints().colorScheme() == Qt.ColorScheme.Dark


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in DARK.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6f7378"))
    return palette


def resolved(theme: str, app: QApplication) -> str:
    """'light' or 'dark': what `theme` means on this system now."""
    if theme == "system":
        return "dark" if os_prefers_dark(app) else "light"
    return theme


def apply_theme(theme: str, app: QApplication | None = None) -> str:
    """Apply 'system', 'light' or 'dark'; returns the resolved 'light' or 'dark'."""
    app = app or QApplication.instance()
    app.setStyle("Fusion")
    mode = resolved(theme, app)
    app.setPalette(dark_palette() if mode == "dark" else app.style().standardPalette())
    app.setProperty("ponder_theme", theme)
    return mode


def follow_system(app: QApplication) -> None:
    """Re-apply the theme when the OS switches light/dark, if the user chose 'system'."""
    def changed(_scheme) -> None:
        if app.property("ponder_theme") == "system":
            apply_theme("system", app)

    app.styleHints().colorSchemeChanged.connect(changed)
