"""Markdown → Qt rich text for one message: markdown-it-py (CommonMark + tables + strikethrough) on the raw text
with HTML off (typed tags and chat-template tokens stay text), code highlighted by pygments with inline styles
under a header (language, Copy link), math (`$…$`, `\\(…\\)`, `$$…$$`, `\\[…\\]`, `\\boxed{…}` also in prose)
as images from ui.math_render. Links are shown, never fetched; remote images become links. A long table shows
its first rows and a note with a Copy link for all of it (ui.markdown_tables)."""
from __future__ import annotations

import hashlib
import html
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache

from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin
from PySide6.QtGui import QImage

from ui import math_render
from ui.markdown_tables import bound_tables, table_note

LIGHT = {"text": "#1f2328", "muted": "#57606a", "link": "#0969da", "code_bg": "#f6f8fa", "code_head": "#eaeef2",
         "border": "#d0d7de", "inline_bg": "#eff1f3", "th_bg": "#f6f8fa", "quote": "#57606a", "pygments": "default"}
DARK = {"text": "#e6edf3", "muted": "#8b949e", "link": "#58a6ff", "code_bg": "#161b22", "code_head": "#21262d",
        "border": "#30363d", "inline_bg": "#2d333b", "th_bg": "#1c2128", "quote": "#8b949e", "pygments": "github-dark"}
_HALF_CLOSED = re.compile(r"\$\$[^$]+\$\Z")
MONO = "'JetBrains Mono', 'Cascadia Mono', 'DejaVu Sans Mono', Menlo, Consolas, monospace"


@dataclass
class Rendered:
    html: str  # for a QTextDocument / QTextBrowser (Qt's HTML subset: tables, inline styles, img)
    images: dict[str, QImage] = field(default_factory=dict)  # "ponder-math:<hash>" -> image, for addResource
    code_blocks: dict[str, str] = field(default_factory=dict)  # key -> raw code (or a cut table), for "ponder:copycode/<key>"


# ---- math syntax: \( \) \[ \] and \boxed{} inline, $$ / \[ blocks that may interrupt a paragraph ----

def _math_inline(state, silent: bool) -> bool:
    src, pos = state.src, state.pos
    if src[pos] != "\\" or pos + 1 >= len(src):
        return False
    nxt = src[pos + 1]
    if nxt in "([":
        close = "\\)" if nxt == "(" else "\\]"
        end = src.find(close, pos + 2)
        if end < 0 or not src[pos + 2:end].strip():
            if not silent:  # unclosed (or still streaming): show the delimiter as typed, not as an escape
                state.push("text", "", 0).content = src[pos:pos + 2]
            state.pos += 2
            return True
        if not silent:
            tok = state.push("ponder_math", "math", 0)
            tok.content, tok.markup, tok.info = src[pos + 2:end], "\\" + nxt, "display" if nxt == "[" else ""
        state.pos = end + 2
        return True
    if src.startswith("\\boxed{", pos):
        end = math_render.closing_brace(src, pos + 6)
        if end < 0 or not src[pos + 7:end].strip():
            return False
        if not silent:
            tok = state.push("ponder_math", "math", 0)
            tok.content, tok.markup, tok.info = src[pos:end + 1], "boxed", ""
        state.pos = end + 1
        return True
    return False


_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}(?![A-Za-z{])")


def _currency(state, silent: bool) -> bool:
    """`$8 in all (10$`: a `$` before a number whose 'formula' up to the next `$` holds plain words is money,
    not math; the `$` stays text (runs before dollarmath's rule)."""
    src, pos = state.src, state.pos
    if src[pos] != "$" or pos + 1 >= len(src) or not src[pos + 1].isdigit():
        return False
    end = src.find("$", pos + 1)
    if end < 0 or not _PROSE_WORD.search(src[pos + 1:end]):
        return False
    if not silent:
        state.push("text", "", 0).content = "$"
    state.pos += 1
    return True


def _math_block(state, start: int, end_line: int, silent: bool) -> bool:
    if state.sCount[start] - state.blkIndent >= 4:
        return False
    begin = state.bMarks[start] + state.tShift[start]
    line = state.src[begin:state.eMarks[start]]
    opener = "$$" if line.startswith("$$") else "\\[" if line.startswith("\\[") else None
    if opener is None:
        return False
    closer = "$$" if opener == "$$" else "\\]"
    body, rest = [], line[2:]
    cur = start
    while True:
        stripped = rest.rstrip()
        if stripped.endswith(closer) and not (cur == start and len(stripped) < 2):
            body.append(stripped[:-2])
            break
        if closer in stripped:  # closes mid-line with text after it: leave it to the inline rules
            return False
        body.append(rest)
        cur += 1
        if cur >= end_line:
            return False
        b = state.bMarks[cur] + state.tShift[cur]
        rest = state.src[b:state.eMarks[cur]]
        if not rest.strip():  # a blank line ends the block without a closing delimiter
            return False
    if silent:
        return True
    tok = state.push("ponder_math_block", "math", 0)
    tok.block, tok.content, tok.markup, tok.map = True, "\n".join(body), opener, [start, cur + 1]
    state.line = cur + 1
    return True


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    dollarmath_plugin(md, allow_space=False, allow_digits=False, double_inline=True, allow_labels=False)
    md.inline.ruler.before("math_inline", "ponder_currency", _currency)
    md.inline.ruler.before("escape", "ponder_math", _math_inline)
    md.block.ruler.before("fence", "ponder_math_block", _math_block,
                          {"alt": ["paragraph", "reference", "blockquote", "list"]})
    md.core.ruler.before("inline", "ponder_tables", bound_tables)  # long tables cut before their cells are parsed
    _renderer_rules(md)
    return md


# ---- pieces of HTML ----

def esc(text: str) -> str:
    return html.escape(text, quote=False)


def attr(text: str) -> str:
    return html.escape(text, quote=True)


@lru_cache(maxsize=256)
def highlight(code: str, lang: str, dark: bool) -> str:
    """Pygments spans with inline colours (Qt has no stylesheet classes); plain escaped text when the language
    is unknown."""
    from pygments import highlight as _hl
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        lexer = get_lexer_by_name(lang, stripnl=False, ensurenl=False) if lang else None
    except ClassNotFound:
        lexer = None
    if lexer is None:
        return esc(code)
    style = (DARK if dark else LIGHT)["pygments"]
    out = _hl(code, lexer, HtmlFormatter(noclasses=True, nowrap=True, style=style))
    return out.rstrip("\n") if not code.endswith("\n\n") else out


def code_block(code: str, lang: str, colours: dict, key: str | None) -> str:
    """A framed block: header row (language, Copy link when `key`), then the code. `key` None: still streaming
    (no highlighting, no Copy: the block is not finished)."""
    label = esc(lang or "code")
    copy = (f'<a href="ponder:copycode/{attr(key)}" style="color:{colours["link"]}; text-decoration:none">Copy</a>'
            if key is not None else f'<span style="color:{colours["muted"]}">…</span>')
    body = highlight(code.rstrip("\n"), lang.lower(), colours is DARK) if key is not None else esc(code.rstrip("\n"))
    c = colours
    return (f'<table width="100%" cellspacing="0" cellpadding="0" border="0" '
            f'style="margin-top:6px; margin-bottom:8px; border-color:{c["border"]}; border-style:solid" '
            f'bgcolor="{c["code_bg"]}">'
            f'<tr><td bgcolor="{c["code_head"]}" style="padding:3px 10px 3px 10px; color:{c["muted"]}">'
            f'<span style="font-size:small">{label}</span></td>'
            f'<td bgcolor="{c["code_head"]}" align="right" style="padding:3px 10px 3px 10px">'
            f'<span style="font-size:small">{copy}</span></td></tr>'
            f'<tr><td colspan="2" style="padding:8px 10px 8px 10px">'
            f'<pre style="margin:0; white-space:pre-wrap; font-family:{MONO}; color:{c["text"]}">{body}</pre>'
            f'</td></tr></table>\n')


class _Env:
    def __init__(self, dark: bool, key_prefix: str, streaming: bool, open_fence: int | None, font_px: int):
        self.dark, self.key_prefix, self.streaming, self.open_fence = dark, key_prefix, streaming, open_fence
        self.font_px = font_px
        self.colours = DARK if dark else LIGHT
        self.images: dict[str, QImage] = {}
        self.code_blocks: dict[str, str] = {}
        self.tables: dict[str, str] = {}
        """Whole cut tables as typed, by the key of their Copy link."""

    def image_tag(self, image: QImage, key: tuple) -> str:
        url = "ponder-math:" + hashlib.blake2b(repr(key).encode(), digest_size=10).hexdigest()
        self.images[url] = image
        size = image.deviceIndependentSize()
        return (f'<img src="{url}" width="{round(size.width())}" height="{round(size.height())}" '
                f'style="vertical-align: middle" />')

    def formula(self, tex: str, display: bool) -> str | None:
        """Image tags for one formula (its top-level \\boxed parts framed), None when mathtext can't set it."""
        tags = []
        for part, boxed in math_render.split_boxed(tex) or [(tex, False)]:
            img = math_render.math_image(part, display=display, dark=self.dark, boxed=boxed, font_px=self.font_px)
            if img is None:
                tags = None
                break
            tags.append(self.image_tag(img, (part, display, self.dark, boxed, self.font_px)))
        if tags is None and "\\boxed" in tex:  # nested \boxed, or a part that is no formula alone: frame it all
            whole = tex.replace("\\boxed{", "{")
            img = math_render.math_image(whole, display=display, dark=self.dark, boxed=True, font_px=self.font_px)
            tags = [self.image_tag(img, (whole, display, self.dark, True, self.font_px))] if img is not None else None
        return "&#8202;".join(tags) if tags is not None else None

    def math(self, tex: str, display: bool, source: str) -> str:
        """Inline math: its images, or its source as code."""
        return self.formula(tex, display) or self.code(source)

    def display(self, tex: str, source: str) -> str:
        """A display formula as a centred block; multi-line ones (align, gather, `\\\\` rows) as a table of
        rows aligned at their first `&`; the source as a code block when mathtext can't set it."""
        rows = math_render.split_rows(tex)
        if rows is None:
            inner = self.formula(tex, True)
            if inner is not None:
                return f'<p align="center" style="margin-top:6px; margin-bottom:6px">{inner}</p>\n'
        else:
            aligned = any(len(r) > 1 for r in rows)
            cells = []
            for row in rows:
                parts = [row[0], " ".join(row[1:])] if aligned else [row[0]]
                tags = ["" if not p.strip() else self.formula(p, True) for p in parts]
                if any(t is None for t in tags):
                    cells = None
                    break
                cells.append(tags)
            if cells is not None:
                trs = "".join(
                    f'<tr><td align="right" valign="middle">{row[0]}</td><td valign="middle">{row[1]}</td></tr>'
                    if aligned else f'<tr><td align="center" valign="middle">{row[0]}</td></tr>' for row in cells)
                return (f'<table align="center" border="0" cellspacing="0" cellpadding="1" '
                        f'style="margin-top:6px; margin-bottom:6px">{trs}</table>\n')
        c = self.colours
        return (f'<pre style="white-space:pre-wrap; font-family:{MONO}; background-color:{c["inline_bg"]}; color:{c["text"]}">'
                f'{esc(source)}</pre>\n')

    def boxed_prose(self, source: str) -> str:
        inner = source[len("\\boxed{"):-1].strip()
        tex = inner.strip("$") if inner.startswith("$") and inner.endswith("$") else inner
        img = math_render.math_image(tex, display=False, dark=self.dark, boxed=True, font_px=self.font_px)
        if img is None:
            img = math_render.text_box_image(inner, dark=self.dark, font_px=self.font_px)
        return self.image_tag(img, ("boxed-prose", inner, self.dark, self.font_px))

    def code(self, text: str) -> str:
        c = self.colours
        return (f'<code style="font-family:{MONO}; background-color:{c["inline_bg"]}; color:{c["text"]}">'
                f'{esc(text)}</code>')


# ---- render rules ----

def _fence(self, tokens, idx, options, env: _Env) -> str:
    tok = tokens[idx]
    lang = tok.info.strip().split(maxsplit=1)[0] if tok.info.strip() else ""
    if tok.type == "fence" and env.open_fence is not None and tok.map and tok.map[0] == env.open_fence:
        return code_block(tok.content, lang, env.colours, None)
    key = f"{env.key_prefix}{len(env.code_blocks)}"
    env.code_blocks[key] = tok.content.removesuffix("\n")
    return code_block(tok.content, lang, env.colours, key)


def _code_inline(self, tokens, idx, options, env: _Env) -> str:
    return env.code(tokens[idx].content)


def _math_inline_rule(self, tokens, idx, options, env: _Env) -> str:
    tok = tokens[idx]
    if tok.type == "ponder_math" and tok.markup == "boxed":
        return env.boxed_prose(tok.content)
    display = tok.type == "math_inline_double" or tok.info == "display"
    closing = {"$": "$", "$$": "$$", "\\(": "\\)", "\\[": "\\]"}.get(tok.markup, "")
    return env.math(tok.content, display, f"{tok.markup}{tok.content}{closing}")


def _math_block_rule(self, tokens, idx, options, env: _Env) -> str:
    tok = tokens[idx]
    closing = "$$" if tok.markup == "$$" else "\\]"
    return env.display(tok.content.strip(), f"{tok.markup}{tok.content}{closing}")


def _href(url: str) -> str:
    """The href attribute of a link written in a message; none for Ponder's own schemes (`ponder:…`): only the
    renderer's Copy links may carry those, so a link in a message never looks like an app action."""
    if url.strip().lower().startswith("ponder"):
        return ""
    return f' href="{attr(url)}"'


def _image(self, tokens, idx, options, env: _Env) -> str:
    """No remote (or local) images are loaded: the picture is shown as a link to where it is."""
    tok = tokens[idx]
    alt = self.renderInline(tok.children or [], options, env) or "image"
    return f'<a{_href(tok.attrGet("src") or "")} style="color:{env.colours["link"]}">[image: {alt}]</a>'


def _link_open(self, tokens, idx, options, env: _Env) -> str:
    return f'<a{_href(tokens[idx].attrGet("href") or "")} style="color:{env.colours["link"]}">'


def _table_open(self, tokens, idx, options, env: _Env) -> str:
    return (f'<table border="1" cellspacing="0" cellpadding="5" '
            f'style="border-collapse:collapse; border-color:{env.colours["border"]}; margin-top:6px; '
            f'margin-bottom:6px">\n')


def _table_close(self, tokens, idx, options, env: _Env) -> str:
    return "</table>\n" + table_note(tokens[idx].meta, env.colours, env.key_prefix, env.streaming, env.tables)


def _cell_open(self, tokens, idx, options, env: _Env) -> str:
    tok = tokens[idx]
    tag = tok.tag
    style = tok.attrGet("style") or ""
    align = style.removeprefix("text-align:").strip() if style.startswith("text-align:") else ""
    a = f' align="{attr(align)}"' if align else ""
    bg = f' bgcolor="{env.colours["th_bg"]}"' if tag == "th" else ""
    return f"<{tag}{a}{bg}>"


def _blockquote_open(self, tokens, idx, options, env: _Env) -> str:
    return f'<blockquote style="color:{env.colours["quote"]}">\n'


def _hr(self, tokens, idx, options, env: _Env) -> str:
    return "<hr />\n"


def _renderer_rules(md: MarkdownIt) -> None:
    for name, fn in {
        "fence": _fence, "code_block": _fence, "code_inline": _code_inline,
        "math_inline": _math_inline_rule, "math_inline_double": _math_inline_rule, "ponder_math": _math_inline_rule,
        "math_block": _math_block_rule, "ponder_math_block": _math_block_rule,
        "image": _image, "link_open": _link_open, "table_open": _table_open, "table_close": _table_close,
        "th_open": _cell_open, "td_open": _cell_open, "blockquote_open": _blockquote_open, "hr": _hr,
    }.items():
        md.add_render_rule(name, fn)


_warm_code: threading.Thread | None = None


def warm_up() -> None:
    """Load mathtext and pygments on background threads (once): called by the first streaming render, so an
    answer's first formula or code block does not stall the GUI thread; the view may call it earlier."""
    global _warm_code
    math_render.warm_up()
    if _warm_code is None:
        _warm_code = threading.Thread(target=lambda: highlight("x = 1\n", "python", False), daemon=True,
                                      name="pygments-warm-up")
        _warm_code.start()


def open_fence_line(text: str) -> int | None:
    """The line of a code fence that is still open at the end of `text` (a reply still streaming), or None."""
    fence, at = None, None
    for n, raw in enumerate(text.split("\n")):
        line = raw.lstrip(" >")
        if fence is None:
            if line.startswith(("```", "~~~")):
                ch = line[0]
                width = len(line) - len(line.lstrip(ch))
                if ch == "`" and "`" in line[width:]:
                    continue  # an info string with a backtick: not a fence
                fence, at = ch * width, n
        elif line.startswith(fence) and not line.strip().strip(fence[0]):
            fence = None
    return at if fence is not None else None


def render_markdown(text: str, *, dark: bool = False, key_prefix: str = "", streaming: bool = False,
                    font_px: int = 15) -> Rendered:
    """One message as Qt rich text. `key_prefix` makes the copy keys unique in the transcript (keys are
    `<key_prefix><n>`, n from 0 in order; a cut table's `<key_prefix>table-<line>`). `streaming`: a code fence
    still open at the end is shown plain, without highlighting or Copy; math, `\\boxed` and `\\[` that have not
    closed yet stay text. `font_px`: the body text's pixel size, which formulas are set to match."""
    md = _parser()
    if streaming:
        warm_up()
    if streaming and _HALF_CLOSED.search(text):
        text = text[:-1]  # "$$x = 1$": the second "$" is on its way; not an inline "$x = 1$" for one frame
    env = _Env(dark, key_prefix, streaming, open_fence_line(text) if streaming else None, font_px)
    tokens = md.parse(text, {})
    body = md.renderer.render(tokens, md.options, env)
    return Rendered(html=body, images=env.images, code_blocks={**env.code_blocks, **env.tables})
