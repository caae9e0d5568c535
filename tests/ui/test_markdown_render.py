"""The message renderer in a real QTextDocument: escaping (code and typed HTML show and copy as themselves), math
as images (inline, display, \\boxed in prose and math), fallbacks for TeX mathtext cannot set, streaming with an
open `$`, `\\[` or fence, Markdown structure (headings, lists, tables, links kept but not fetched) and the
light/dark colours."""
import subprocess
import sys

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QColor, QTextDocument, QTextTable

from ui import math_render
from ui.markdown_render import open_fence_line, render_markdown
from ui.math_render import split_boxed


@pytest.fixture(autouse=True)
def _app(qapp):
    return qapp


def document(r) -> QTextDocument:
    doc = QTextDocument()
    for url, image in r.images.items():
        doc.addResource(QTextDocument.ResourceType.ImageResource, QUrl(url), image)
    doc.setHtml(r.html)
    doc.setTextWidth(600)
    return doc


def fragments(doc: QTextDocument):
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid():
                yield block, frag
            it += 1
        block = block.next()


def image_names(doc: QTextDocument) -> list[str]:
    return [f.charFormat().toImageFormat().name() for _, f in fragments(doc) if f.charFormat().isImageFormat()]


def anchors(doc: QTextDocument) -> list[str]:
    return [f.charFormat().anchorHref() for _, f in fragments(doc) if f.charFormat().isAnchor()]


def ink(image) -> int:
    """Pixels that are not background (any alpha)."""
    return sum(1 for y in range(image.height()) for x in range(image.width()) if image.pixelColor(x, y).alpha() > 0)


def mean_ink_lightness(image) -> float:
    vals = [image.pixelColor(x, y) for y in range(image.height()) for x in range(image.width())]
    vals = [c for c in vals if c.alpha() > 200]
    return sum(c.lightnessF() for c in vals) / len(vals)


CODE = 'if a < b && c > d:\n    print("<b>&amp;</b>")'


def test_code_shows_and_copies_as_itself():
    r = render_markdown(f"Look:\n\n```python\n{CODE}\n```\n\nand `x<y && z>w` inline.", key_prefix="m3-")
    doc = document(r)
    text = doc.toPlainText()
    assert 'if a < b && c > d:' in text and 'print("<b>&amp;</b>")' in text
    assert "x<y && z>w" in text and "&lt;" not in text
    assert r.code_blocks == {"m3-0": CODE}
    assert "ponder:copycode/m3-0" in anchors(doc)
    assert "python" in text and "Copy" in text
    # highlighted: the keyword has a colour of its own, unlike the surrounding text
    colours = {f.charFormat().foreground().color().name() for _, f in fragments(doc) if "if" == f.text().strip()}
    assert colours and colours != {"#000000"}


def test_copy_keys_count_in_order_and_indented_code_counts():
    r = render_markdown("```\none\n```\n\ntext\n\n    two\n\n~~~js\nthree\n~~~\n", key_prefix="k")
    assert r.code_blocks == {"k0": "one", "k1": "two", "k2": "three"}


def test_typed_html_and_template_tokens_are_text():
    r = render_markdown("Say <b>hi</b> then <|im_start|>user and <script>alert(1)</script> at AT&T")
    doc = document(r)
    text = doc.toPlainText()
    assert "<b>hi</b>" in text and "<|im_start|>user" in text and "<script>alert(1)</script>" in text
    assert "AT&T" in text
    assert not any(f.charFormat().fontWeight() > 400 for _, f in fragments(doc))


def test_inline_and_display_math_are_images():
    r = render_markdown("Inline $x^2+1$ and \\(\\alpha\\).\n\nThus:\n\\[\n\\frac{a}{b} = c\n\\]\n\n$$\\sqrt{2}$$\n")
    doc = document(r)
    names = image_names(doc)
    assert len(names) == 4 and set(names) == set(r.images)
    assert all(n.startswith("ponder-math:") for n in names)
    for image in r.images.values():
        assert not image.isNull() and ink(image) > 20
    assert "$" not in doc.toPlainText() and "\\frac" not in doc.toPlainText()
    centred = [b for b, f in fragments(doc) if f.charFormat().isImageFormat()
               and b.blockFormat().alignment() & Qt.AlignmentFlag.AlignHCenter]
    assert len(centred) == 2  # the two display formulas
    inline = [f for b, f in fragments(doc) if f.charFormat().isImageFormat()][0].charFormat()
    assert inline.verticalAlignment() == inline.VerticalAlignment.AlignMiddle


def test_boxed_in_prose_and_in_math_is_framed():
    r = render_markdown("The answer is \\boxed{8}. In math: $x = \\boxed{42}$. Words: \\boxed{\\text{Yes}}.")
    doc = document(r)
    assert "boxed" not in doc.toPlainText()
    assert len(image_names(doc)) == 4  # 8, "x =", 42, Yes
    boxed = math_render.math_image("8", display=False, dark=False, boxed=True)
    plain = math_render.math_image("8", display=False, dark=False)
    assert boxed is not None and plain is not None
    assert boxed.width() > plain.width() and boxed.height() >= plain.height()
    mid = boxed.height() // 2
    box = QColor(math_render.LIGHT["box"])
    edge = boxed.pixelColor(1, mid)
    assert edge.alpha() > 0 and abs(edge.blue() - box.blue()) < 60  # the frame's left side
    assert plain.pixelColor(0, plain.height() // 2).alpha() == 0
    assert boxed in r.images.values() or any(im.size() == boxed.size() for im in r.images.values())


def test_split_boxed():
    assert split_boxed("x = \\boxed{42}") == [("x = ", False), ("42", True)]
    assert split_boxed("\\frac{\\boxed{1}}{2}") == [("\\frac{\\boxed{1}}{2}", False)]
    assert split_boxed("\\boxed{a}+\\boxed{b}") == [("a", True), ("+", False), ("b", True)]


def test_nested_boxed_frames_the_whole_formula():
    r = render_markdown("$\\frac{\\boxed{1}}{2}$")
    assert len(r.images) == 1 and "\\frac" not in document(r).toPlainText()


def test_broken_formula_falls_back_to_source():
    r = render_markdown("Bad $\\frac{1}{2$ and\n\n$$\n\\begin{array}{cc} a &= b \\\\ c &= d \\end{array}\n$$\n")
    doc = document(r)
    text = doc.toPlainText()
    assert "$\\frac{1}{2$" in text
    assert "\\begin{array}{cc} a &= b" in text
    assert not r.images
    assert math_render.math_image("\\frac{1}{", display=False, dark=False) is None


def test_common_latex_beyond_mathtext_is_mapped():
    for tex in ["a \\le b \\ge c", "\\tfrac{1}{2}", "\\dbinom{n}{k}", "\\displaystyle\\sum_{i=1}^n i", "p \\implies q",
                "7 \\pmod{3}", "\\textbf{v}", "\\left\\lvert x \\right\\rvert", "\\frac12", "\\text{area} = \\pi r^2"]:
        assert math_render.math_image(tex, display=False, dark=False) is not None, tex


def test_dollar_amounts_are_not_math():
    line = "She pays $5 for apples and $3 for pears, so $5 + $3 = $8 in all (10$ was too much)."
    r = render_markdown(line)
    assert not r.images and line in document(r).toPlainText()


def test_streaming_open_math_and_fence_stay_plain():
    r = render_markdown("So the value is $x^2 + \\frac{1}{", streaming=True)
    assert not r.images and "$x^2 + \\frac{1}{" in document(r).toPlainText()
    r = render_markdown("Thus:\n\\[\nx = \\frac{1}", streaming=True)
    assert not r.images and "\\[" in document(r).toPlainText()
    r = render_markdown("Answer \\boxed{4", streaming=True)
    assert not r.images and "\\boxed{4" in document(r).toPlainText()
    live = "Here:\n\n```python\nif a < b:\n    pass"
    r = render_markdown(live, streaming=True, key_prefix="L")
    doc = document(r)
    assert "if a < b:" in doc.toPlainText() and not r.code_blocks
    assert not any(a.startswith("ponder:copycode/") for a in anchors(doc))
    done = render_markdown(live + "\n```\n", streaming=True, key_prefix="L")
    assert done.code_blocks == {"L0": "if a < b:\n    pass"}
    # a closed formula renders while the rest still streams
    r = render_markdown("We get $x=1$ and then $y", streaming=True)
    assert len(r.images) == 1 and "$y" in document(r).toPlainText()


def test_open_fence_line():
    assert open_fence_line("a\n```py\nx") == 1
    assert open_fence_line("a\n```py\nx\n```\n") is None
    assert open_fence_line("````\n```\nx") == 0
    assert open_fence_line("> ```\n> x") == 0
    assert open_fence_line("inline ``` not a fence") is None


def test_markdown_structure():
    text = ("# Title\n\n## Sub\n\n- one\n- two\n\n1. first\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n"
            "[site](https://example.com/x?a=1&b=2) ![pic](https://example.com/p.png) ~~old~~ **bold**\n\n> quoted\n")
    r = render_markdown(text)
    doc = document(r)
    levels = []
    block = doc.begin()
    lists = 0
    while block.isValid():
        levels.append(block.blockFormat().headingLevel())
        lists += block.textList() is not None
        block = block.next()
    assert 1 in levels and 2 in levels
    assert lists == 3
    tables = [f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]
    assert tables and tables[0].rows() == 2 and tables[0].columns() == 2
    hrefs = anchors(doc)
    assert "https://example.com/x?a=1&b=2" in hrefs and "https://example.com/p.png" in hrefs
    assert not image_names(doc)  # a Markdown image is a link, never loaded
    assert any(f.charFormat().fontStrikeOut() for _, f in fragments(doc))
    assert any(f.charFormat().fontWeight() > 400 and f.text() == "bold" for _, f in fragments(doc))
    assert "quoted" in doc.toPlainText()


def test_links_written_in_a_message_never_carry_the_apps_own_scheme():
    r = render_markdown("[again](ponder:regenerate/1) ![pic](PONDER:delete/2) <ponder:edit/999> "
                        "[copy](ponder:copycode/m1-0) [site](https://example.com)\n\n```\ncode\n```\n",
                        key_prefix="m1-")
    doc = document(r)
    hrefs = anchors(doc)
    assert "https://example.com" in hrefs  # web links stay links
    assert [h for h in hrefs if h.lower().startswith("ponder")] == ["ponder:copycode/m1-0"]  # the code's Copy only
    assert "again" in doc.toPlainText() and "[image: pic]" in doc.toPlainText()  # the text stays


def test_dark_changes_code_and_math_colours():
    src = "```python\ndef f():\n    return 1\n```\n\n$x^2 + y^2$"
    light, dark = render_markdown(src), render_markdown(src, dark=True)

    def keyword_colour(r):
        doc = document(r)
        return {f.charFormat().foreground().color().name() for _, f in fragments(doc) if f.text().strip() == "def"}

    assert keyword_colour(light) != keyword_colour(dark)
    assert light.html != dark.html
    (li,), (di,) = light.images.values(), dark.images.values()
    assert mean_ink_lightness(li) < 0.4 < 0.6 < mean_ink_lightness(di)


def test_math_images_are_cached():
    a = math_render.math_image("e^{i\\pi}+1=0", display=True, dark=False)
    b = math_render.math_image("e^{i\\pi}+1=0", display=True, dark=False)
    c = math_render.math_image("e^{i\\pi}+1=0", display=False, dark=False)
    assert a is b and a is not c and a.width() > c.width()


def test_importing_the_renderer_does_not_import_matplotlib():
    code = ("import sys; from PySide6.QtWidgets import QApplication; app = QApplication([]);"
            "from ui.markdown_render import render_markdown; r = render_markdown('# hi\\n\\n```py\\nx=1\\n```');"
            "assert 'matplotlib' not in sys.modules, 'eager'; render_markdown('$x$');"
            "assert 'matplotlib' in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_multiline_display_is_a_table_of_rows_aligned_at_the_ampersand():
    src = "$$\n\\begin{align*}\nx + 1 &= 3 \\\\\nx &= 2 \\nonumber\n\\end{align*}\n$$\n\nand\n\n\\[ a \\\\ b \\]\n"
    r = render_markdown(src)
    doc = document(r)
    tables = [f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]
    assert [(t.rows(), t.columns()) for t in tables] == [(2, 2), (2, 1)]
    assert len(image_names(doc)) == 6 and "align" not in doc.toPlainText()
    left = tables[0].cellAt(0, 0).firstCursorPosition().blockFormat().alignment()
    assert left & Qt.AlignmentFlag.AlignRight


def test_unsupported_environment_falls_back_to_a_source_block():
    src = "$$\n\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}\n$$\n"
    r = render_markdown(src)
    doc = document(r)
    assert not r.images and "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}" in doc.toPlainText()


def test_half_closed_display_dollars_do_not_flash_inline_math():
    assert not render_markdown("Then $$x = 1$", streaming=True).images
    assert len(render_markdown("Then $$x = 1$$", streaming=True).images) == 1


def test_high_dpi_images_keep_their_layout_size(monkeypatch):
    one = math_render.math_image("\\int_0^1 f", display=False, dark=False)
    monkeypatch.setattr(math_render, "_ratio", lambda: 2.0)
    two = math_render.math_image("\\int_0^1 f", display=False, dark=False)
    assert two.devicePixelRatio() == 2.0 and two.width() > 1.7 * one.width()
    assert abs(two.deviceIndependentSize().width() - one.width()) <= 2
    r = render_markdown("$\\int_0^1 f$")
    assert f'width="{round(two.deviceIndependentSize().width())}"' in r.html


IMG = "\ufffc"  # a formula image in QTextDocument.toPlainText()
ODD = [  # (typed, what the reader sees: the document's text, ends stripped; None: exactly what was typed)
    ("", None), ("$", None), ("$$", None), ("\\[", None), ("\\(", None), ("\\boxed{", None), ("\\boxed{}", None),
    ("```", "code\nCopy"), ("~~~\n", "code\nCopy"), ("$x$$", IMG + "$"), ("$$$$", None), ("\\[\\]", None),
    ("\\(\\)", "\\()"),  # the unclosed `\(` stays as typed; `\)` alone is CommonMark's escaped `)`
    ("| a |\n|---|\n| $x$ |", "a\n" + IMG), ("> $$\n> x\n> $$", IMG), ("- \\[\n  x\n  \\]", IMG),
    ("$\\frac{" + "{" * 50 + "$", None),  # mathtext cannot set it: its source, not nothing
    ("\\boxed{\\boxed{1}}", IMG), ("$a$" * 200, IMG * 200), ("x" * 20000, None),
    ("```py\n" + "<&>" * 1000, "py\nCopy\n" + "<&>" * 1000),  # typed HTML shows as itself
    ("$" + "x+" * 2000 + "1$", None),  # past math_render.MAX_TEX: shown as source
]


@pytest.mark.parametrize(("text", "shown"), ODD, ids=range(len(ODD)))
def test_odd_input_never_raises_nor_loses_what_was_typed(text, shown):
    """Every odd input renders, and what it shows is each formula as an image or, where none can be set or the
    math is unclosed, the characters as typed. Streaming shows the same, except that an unfinished code block
    has no Copy link yet and a closing `$` at the very end may be the first half of `$$`."""
    shown = text if shown is None else shown
    streaming = shown.replace("Copy", "\u2026") if text.startswith(("```", "~~~")) else shown
    if text == "$a$" * 200:
        streaming = IMG * 199 + "$a"
    for live, expected in ((False, shown), (True, streaming)):
        assert document(render_markdown(text, streaming=live)).toPlainText().strip() == expected


def test_formulas_follow_the_font_size():
    small, large = render_markdown("$x^2$", font_px=12), render_markdown("$x^2$", font_px=24)
    (s,), (g,) = small.images.values(), large.images.values()
    assert g.height() > 1.6 * s.height() and set(small.images) != set(large.images)


def test_streaming_warms_mathtext_up_in_the_background():
    code = ("import sys; from PySide6.QtWidgets import QApplication; app = QApplication([]);"
            "from ui import math_render; from ui.markdown_render import render_markdown;"
            "render_markdown('Let me think', streaming=True); t = math_render.warming();"
            "assert t is not None and t.name == 'mathtext-warm-up'; t.join(120);"
            "assert 'matplotlib.mathtext' in sys.modules; r = render_markdown('$x$', streaming=True);"
            "assert len(r.images) == 1; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_long_code_lines_wrap_inside_the_width_and_copy_whole():
    line = "x = [" + ", ".join(str(i) for i in range(200)) + "]"
    r = render_markdown(f"```python\n{line}\n```", key_prefix="w")
    doc = document(r)
    assert doc.idealWidth() <= 600 + 1 and doc.size().width() <= 600 + 1
    assert r.code_blocks == {"w0": line}


def huge_table(rows: int) -> str:
    return "| # | item | price |\n|---|:---|---:|\n" + "\n".join(f"| {i} | *thing* {i} | {i * 2.5} |" for i in range(rows))


def test_a_huge_table_renders_its_first_rows_and_a_note_with_the_whole_table_to_copy():
    """A 2,000-row table: a bounded document (MAX_TABLE_ROWS body rows, then a note); the whole table stays
    copyable through the note's link; the code blocks around it keep their keys; a normal table is untouched."""
    from ui.markdown_tables import MAX_TABLE_ROWS

    table = huge_table(2000)
    r = render_markdown(f"Prices:\n\n```\nbefore\n```\n\n{table}\n\nThat is all.\n\n```\nafter\n```", key_prefix="m5-")
    doc = document(r)
    (big,) = [f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable) and f.columns() == 3]
    assert big.rows() == 1 + MAX_TABLE_ROWS  # the header and the first rows; the code blocks are tables of 2
    text = doc.toPlainText()
    assert f"… {2000 - MAX_TABLE_ROWS:,} more rows not shown" in text and "That is all." in text
    assert f"thing {MAX_TABLE_ROWS - 1}" in text and f"thing {MAX_TABLE_ROWS}" not in text
    assert r.code_blocks["m5-0"] == "before" and r.code_blocks["m5-1"] == "after"  # fence keys as before
    assert anchors(doc) == ["ponder:copycode/m5-0", "ponder:copycode/m5-table-6", "ponder:copycode/m5-1"]
    assert r.code_blocks["m5-table-6"] == table  # the whole table, as typed
    streaming = document(render_markdown(table, streaming=True))  # still growing: the note, no Copy link yet
    assert "more rows not shown" in streaming.toPlainText() and not anchors(streaming)
    normal = document(render_markdown(huge_table(MAX_TABLE_ROWS)))
    (small,) = [f for f in normal.rootFrame().childFrames() if isinstance(f, QTextTable)]  # no code block here
    assert small.rows() == 1 + MAX_TABLE_ROWS and "not shown" not in normal.toPlainText() and not anchors(normal)
