"""The report as a list of blocks, rendered to Markdown and to a self-contained HTML page from the same blocks.

Sections build blocks; nothing here knows what a run folder is, so examples reuse it for
their own pages (``examples/compare_with_peers.py``).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gaplan.core.atomic_write import atomic_write_text
from gaplan.runs.folder import path_in


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    right_aligned: frozenset[int] = frozenset()  # column indexes of numbers


@dataclass(frozen=True)
class Image:
    file: str  # a PNG next to the page
    alt: str


Block = Heading | Paragraph | Bullets | Table | Image


def write_pages(run_dir: str, blocks: Sequence[Block], title: str, images: dict[str, bytes],
                stem: str = "report") -> list[str]:
    """``<stem>.md`` and a self-contained ``<stem>.html`` rendered from the same blocks; returns their names."""
    names = [f"{stem}.md", f"{stem}.html"]
    write_text(run_dir, names[0], render_markdown(blocks))
    write_text(run_dir, names[1], render_html(blocks, title, images))
    return names


def write_text(run_dir: str, name: str, text: str) -> None:
    """A text file (Markdown, HTML, JSON) in ``run_dir``, written atomically."""
    atomic_write_text(path_in(run_dir, name), text)


# ---------------------------------------------------------------------------------------------------------------------
# Markdown


def _markdown_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right_aligned: frozenset[int] = frozenset()) -> str:
    """A padded GitHub-style table (no tabulate dependency); ``right_aligned`` holds number columns."""
    cells = [[_markdown_cell(h) for h in headers], *[[_markdown_cell(c) for c in row] for row in rows]]
    widths = [max(3, *(len(row[i]) for row in cells)) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        padded = [cell.rjust(width) if i in right_aligned else cell.ljust(width)
                  for i, (cell, width) in enumerate(zip(row, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + ":" if i in right_aligned else "-" * w for i, w in enumerate(widths)]
    return "\n".join([line(cells[0]), "| " + " | ".join(rule) + " |", *(line(row) for row in cells[1:])])


def render_markdown(blocks: Sequence[Block]) -> str:
    """The blocks as Markdown; images are links to the PNG files next to the page."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Bullets):
            parts.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            parts.append(markdown_table(block.headers, block.rows, block.right_aligned))
        else:
            parts.append(f"![{block.alt}]({block.file})")
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# HTML

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5em 2em 3em; background: #fff; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: 0.3em; }
h2 { margin-top: 2em; border-bottom: 1px solid #eee; padding-bottom: 0.2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def _inline_html(text: str) -> str:
    """The little Markdown the blocks use (bold, code, escaped star) as HTML."""
    escaped = html.escape(text.replace("\\*", "*"), quote=False)
    return _CODE.sub(r"<code>\1</code>", _BOLD.sub(r"<strong>\1</strong>", escaped))


def render_html(blocks: Sequence[Block], title: str, images: dict[str, bytes]) -> str:
    """A self-contained page: inline CSS, charts as data: URLs, nothing fetched from anywhere."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_inline_html(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_inline_html(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>\n" + "\n".join(f"<li>{_inline_html(item)}</li>" for item in block.items) + "\n</ul>")
        elif isinstance(block, Table):
            parts.append(_html_table(block))
        elif block.file in images:
            data = base64.b64encode(images[block.file]).decode("ascii")
            parts.append(f'<p><img src="data:image/png;base64,{data}" alt="{html.escape(block.alt)}"></p>')
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{_STYLE}</style>\n</head>\n<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n")


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{_inline_html(h)}</th>" for h in table.headers)
    rows = []
    for row in table.rows:
        cells = "".join(f'<td class="num">{_inline_html(c)}</td>' if i in table.right_aligned else f"<td>{_inline_html(c)}</td>"
                        for i, c in enumerate(row))
        rows.append(f"<tr>{cells}</tr>")
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>"
