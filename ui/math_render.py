"""TeX → QImage for the transcript: matplotlib's mathtext (Agg rasteriser, offline), coloured for the light or
dark palette, optionally framed (`\\boxed`), cached in an LRU. matplotlib is imported on the first formula only,
so starting the app does not pay for it. What mathtext cannot parse gives None (the caller shows the source).
Also the TeX-level cuts mathtext cannot make itself: top-level `\\boxed{…}` parts and multi-line rows."""
from __future__ import annotations

import re
import threading
from collections import OrderedDict

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QGuiApplication, QImage, QPainter, QPen

CACHE_SIZE = 512
MAX_TEX = 2000  # longer "formulas" are shown as source (mathtext time grows with length)
DISPLAY_SCALE = 1.2
LIGHT = {"text": "#1f2328", "box": "#2f81f7", "box_bg": "#eef4ff"}
DARK = {"text": "#e6edf3", "box": "#58a6ff", "box_bg": "#1b2a3f"}

# LaTeX that models write and mathtext lacks, rewritten to what mathtext has (or dropped when only spacing/sizing).
_MACROS = [
    (r"\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits)(?![A-Za-z])", ""),
    (r"\\(?:big|Big|bigg|Bigg)(?:l|r|m)?(?![A-Za-z])", ""),
    (r"\\tag\*?\{[^{}]*\}", ""),
    (r"\\([dt]?frac)\s*(\w)\s*(\w)", r"\\\1{\2}{\3}"),
    (r"\\le(?![A-Za-z])", r"\\leq"),
    (r"\\ge(?![A-Za-z])", r"\\geq"),
    (r"\\[dt]frac(?![A-Za-z])", r"\\frac"),
    (r"\\[dt]binom(?![A-Za-z])", r"\\binom"),
    (r"\\textbf(?![A-Za-z])", r"\\mathbf"),
    (r"\\textit(?![A-Za-z])", r"\\mathit"),
    (r"\\textrm(?![A-Za-z])", r"\\mathrm"),
    (r"\\iff(?![A-Za-z])", r"\\Leftrightarrow"),
    (r"\\implies(?![A-Za-z])", r"\\Rightarrow"),
    (r"\\[lr]vert(?![A-Za-z])", "|"),
    (r"\\[lr]Vert(?![A-Za-z])", r"\\Vert"),
    (r"\\pmod\{([^{}]*)\}", r"\\ (\\mathrm{mod}\\ \1)"),
    (r"\\(?:bmod|mod)(?![A-Za-z])", r"\\ \\mathrm{mod}\\ "),
]
_MACROS = [(re.compile(a), b) for a, b in _MACROS]

_DISPLAY_FRAC = re.compile(r"\\frac(?![A-Za-z])")  # display math: full-size fractions, as TeX sets them

_cache: OrderedDict[tuple, QImage | None] = OrderedDict()
_lock = threading.Lock()
_parser = None
_parse_lock = threading.RLock()  # mathtext is not thread-safe; the warm-up thread and the GUI thread share it
_warm: threading.Thread | None = None


def normalize(tex: str) -> str:
    """The TeX as mathtext takes it: one line, common macros mapped."""
    tex = " ".join(tex.split())
    for rx, repl in _MACROS:
        tex = rx.sub(repl, tex)
    return tex.strip()


_ROWS_ENV = re.compile(r"\\begin\{(align|aligned|alignat|eqnarray|gather|gathered|split|equation|multline)(\*?)\}"
                       r"(?:\{\d+\})?(.*)\\end\{\1\2\}", re.S)
_ROW_BREAK = re.compile(r"\\\\(?:\[[^\]]*\])?")
_NO_NUMBER = re.compile(r"\\(?:nonumber|notag)(?![A-Za-z])|\\label\{[^{}]*\}")


def split_rows(tex: str) -> list[list[str]] | None:
    """A multi-line display (`align`, `aligned`, `gather`, … or rows split by `\\\\`) as rows of `&` cells,
    which mathtext cannot lay out itself; None for a single-line formula."""
    m = _ROWS_ENV.fullmatch(tex.strip())
    if m:
        body = m.group(3)
    elif "\\\\" in tex and "\\begin" not in tex:
        body = tex
    else:
        return None
    rows = [_NO_NUMBER.sub("", row) for row in _ROW_BREAK.split(body)]
    rows = [re.split(r"(?<!\\)&", row) for row in rows if row.strip()]
    return rows or None


def closing_brace(src: str, start: int) -> int:
    """Index of the brace closing the one at `start`, or -1."""
    depth = 0
    i = start
    while i < len(src):
        c = src[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def split_boxed(tex: str) -> list[tuple[str, bool]]:
    """The formula cut at its top-level `\\boxed{…}` groups: [(tex, boxed)], each drawn as its own image.
    A `\\boxed` nested in braces is not cut (the caller frames the whole formula)."""
    parts, depth, i, last = [], 0, 0, 0
    while i < len(tex):
        c = tex[i]
        if c == "\\" and depth == 0 and tex.startswith("\\boxed{", i):
            end = closing_brace(tex, i + 6)
            if end < 0:
                break
            parts.append((tex[last:i], False))
            parts.append((tex[i + 7:end], True))
            i = last = end + 1
            continue
        if c == "\\":
            i += 2
            continue
        depth += c == "{"
        depth -= c == "}"
        i += 1
    parts.append((tex[last:], False))
    return [(t, b) for t, b in parts if t.strip()]


def _mathtext():
    global _parser
    if _parser is None:
        from matplotlib.mathtext import MathTextParser  # lazy: ~0.3 s, only when the first formula shows

        _parser = MathTextParser("agg")
    return _parser


def _ratio() -> float:
    app = QGuiApplication.instance()
    screen = app.primaryScreen() if app is not None else None
    return max(1.0, screen.devicePixelRatio()) if screen is not None else 1.0


def warm_up() -> None:
    """Import matplotlib's mathtext and load its fonts on a background thread (once), so the first formula does
    not stall the GUI thread for the import (~0.3–1.5 s). A formula asked for meanwhile waits only for the rest."""
    global _warm
    if _parser is not None or _warm is not None:
        return
    _warm = threading.Thread(target=_warm_body, args=(_ratio(),), name="mathtext-warm-up", daemon=True)
    _warm.start()


def _warm_body(ratio: float) -> None:
    for tex, display in [("x^2 + y_1", False), (r"\sum_{i=1}^n \int_0^1 \sqrt{x} \left(\frac{a}{b}\right) \leq \pi", True)]:
        _raster(tex, 15 * (DISPLAY_SCALE if display else 1.0), ratio, display)


def warming() -> threading.Thread | None:
    return _warm


def _raster(tex: str, px: float, ratio: float, display: bool = False):
    """(alpha mask as a numpy array, depth below the baseline in device pixels) or None."""
    with _parse_lock:
        return _raster_locked(tex, px, ratio, display)


def _raster_locked(tex: str, px: float, ratio: float, display: bool):
    from matplotlib.font_manager import FontProperties

    tex = normalize(tex)
    if len(tex) > MAX_TEX:
        return None
    if display:
        tex = _DISPLAY_FRAC.sub(r"\\dfrac", tex)
    if not tex or "$" in tex:
        return None
    try:
        parsed = _mathtext().parse(f"${tex}$", dpi=72 * ratio, prop=FontProperties(size=px))
    except Exception:  # mathtext raises ValueError for unknown TeX, others for odd fonts/glyphs
        return None
    mask = parsed.image
    if mask.size == 0 or mask.max() == 0:
        return None
    return mask, max(0.0, float(parsed.depth))


def _text_raster(text: str, px: float, ratio: float, font_family: str = ""):
    """Plain text drawn by Qt (boxed prose mathtext cannot parse) as (alpha QImage, depth)."""
    font = QFont(font_family) if font_family else QFont()
    font.setPixelSize(max(1, round(px * ratio)))
    fm = QFontMetricsF(font)
    w, h = max(1, int(fm.horizontalAdvance(text)) + 2), max(1, int(fm.height()) + 1)
    img = QImage(w, h, QImage.Format.Format_Alpha8)
    img.fill(0)
    p = QPainter(img)
    p.setFont(font)
    p.setPen(QColor(0, 0, 0, 255))
    p.drawText(QRectF(0, 0, w, h), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, text)
    p.end()
    return img, fm.descent()


def _compose(mask, depth: float, px: float, ratio: float, colours: dict, boxed: bool) -> QImage:
    """Colour the mask, pad it so its centre sits on the text's math axis (the <img> is aligned 'middle'),
    draw the frame when boxed."""
    if isinstance(mask, QImage):
        h, w = mask.height(), mask.width()
        alpha = mask
    else:
        h, w = mask.shape
        data = mask.astype("uint8").tobytes()
        alpha = QImage(data, w, h, w, QImage.Format.Format_Alpha8).copy()
    pad = round((5 if boxed else 1) * ratio)
    top_h, bottom_h = h - depth, depth
    axis = 0.3 * px * ratio  # the math axis above the baseline, roughly where Qt puts the middle of the line
    skew = (top_h - bottom_h) - 2 * axis  # > 0: more ink above the axis than below: pad below
    extra_top, extra_bottom = (0, round(skew)) if skew > 0 else (round(-skew), 0)
    W, H = w + 2 * pad, h + 2 * pad + extra_top + extra_bottom
    out = QImage(W, H, QImage.Format.Format_ARGB32_Premultiplied)
    out.fill(0)
    p = QPainter(out)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    if boxed:
        frame = QRectF(ratio / 2, extra_top + ratio / 2, W - ratio, h + 2 * pad - ratio)
        p.setPen(QPen(QColor(colours["box"]), 1.5 * ratio))
        p.setBrush(QColor(colours["box_bg"]))
        p.drawRoundedRect(frame, 3 * ratio, 3 * ratio)
    ink = QImage(w, h, QImage.Format.Format_ARGB32_Premultiplied)
    ink.fill(QColor(colours["text"]))
    q = QPainter(ink)
    q.setCompositionMode(QPainter.CompositionMode.CompositionMode_DestinationIn)
    q.drawImage(0, 0, alpha)
    q.end()
    p.drawImage(pad, pad + extra_top, ink)
    p.end()
    out.setDevicePixelRatio(ratio)
    return out


def math_image(tex: str, *, display: bool, dark: bool, boxed: bool = False, font_px: int = 15) -> QImage | None:
    """The formula as an image (device-pixel-ratio aware: `image.deviceIndependentSize()` is its layout size),
    or None when mathtext cannot typeset it. Cached by (tex, display, dark, boxed, font_px, ratio)."""
    ratio = _ratio()
    key = (tex, display, dark, boxed, font_px, ratio)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    px = font_px * (DISPLAY_SCALE if display else 1.0)
    raster = _raster(tex, px, ratio, display)
    image = None
    if raster is not None:
        image = _compose(*raster, px, ratio, DARK if dark else LIGHT, boxed)
    with _lock:
        _cache[key] = image
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return image


def text_box_image(text: str, *, dark: bool, font_px: int = 15) -> QImage:
    """A framed image of plain text: `\\boxed{…}` whose content is not TeX mathtext can read."""
    ratio = _ratio()
    key = ("text", text, dark, font_px, ratio)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    image = _compose(*_text_raster(text, font_px, ratio), font_px, ratio, DARK if dark else LIGHT, True)
    with _lock:
        _cache[key] = image
    return image


def cache_clear() -> None:
    """Forget every image, and matplotlib's own parse cache (so a benchmark's 'cold' is cold)."""
    with _lock:
        _cache.clear()
    if _parser is not None:
        type(_parser)._parse_cached.cache_clear()
