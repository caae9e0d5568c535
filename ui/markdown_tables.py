"""Long Markdown tables, bounded: a reply with a table of thousands of rows would take seconds to parse and lay
out on the GUI thread. A markdown-it core rule, run between block and inline parsing, keeps each table's first
MAX_TABLE_ROWS body rows and drops the rest before their cells are parsed; the table is followed by a note
("… k more rows") with a Copy link for the whole table as typed (ui.markdown_render wires both in). Tables of
up to MAX_TABLE_ROWS rows are not touched."""
from __future__ import annotations

import html

MAX_TABLE_ROWS = 100
"""Body rows drawn per table; the rest are counted in the note and copied with its link."""


def bound_tables(state) -> None:
    """markdown-it core rule (before "inline"): cut every table to MAX_TABLE_ROWS body rows. A cut table's
    `table_close` token gets meta {'hidden': rows left out, 'source': the table's lines, 'line': its first}."""
    out, rows, in_body, table = [], 0, False, None
    lines: list[str] | None = None
    for tok in state.tokens:
        if tok.type == "table_open":
            table, rows = tok, 0
        elif tok.type == "tbody_open":
            in_body = True
        elif tok.type == "tbody_close":
            in_body = False
        elif in_body and tok.type == "tr_open":
            rows += 1
        if in_body and rows > MAX_TABLE_ROWS:
            continue  # a row past the limit, from its tr_open to its tr_close
        if tok.type == "table_close" and rows > MAX_TABLE_ROWS and table is not None and table.map:
            if lines is None:
                lines = state.src.split("\n")
            start, end = table.map
            tok.meta = {"hidden": rows - MAX_TABLE_ROWS, "source": "\n".join(lines[start:end]).rstrip("\n"),
                        "line": start}
        out.append(tok)
    if len(out) != len(state.tokens):
        state.tokens = out


def table_note(meta: dict, colours: dict, key_prefix: str, streaming: bool, sources: dict[str, str]) -> str:
    """The note after a cut table: how many rows are not shown and, once the reply has finished, a Copy link for
    the whole table (its source goes into `sources` under the link's key)."""
    if not meta or "hidden" not in meta:
        return ""
    hidden = meta["hidden"]
    text = f"… {hidden:,} more row{'s' if hidden != 1 else ''} not shown"
    if not streaming:  # while it streams the table may still grow: no Copy yet (as for an open code fence)
        key = f"{key_prefix}table-{meta['line']}"
        sources[key] = meta["source"]
        text += (f' · <a href="ponder:copycode/{html.escape(key, quote=True)}" style="color:{colours["link"]}; '
                 'text-decoration:none">Copy the whole table</a>')
    return f'<p style="color:{colours["muted"]}; margin-top:0px">{text}</p>\n'
