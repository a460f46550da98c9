"""One document model, two renderings: Markdown and a self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

from gaplan.report import Bullets, Heading, Image, Paragraph, Table, markdown_table, write_pages
from tests.report.runs import PNG_SIGNATURE

BLOCKS = [Heading(1, "Title"), Paragraph("Made by `gaplan probe`; **B\\* is** 35."), Bullets(["one", "**two**"]),
          Table(["name", "value"], [["a|b", "1"], ["c", "22"]], frozenset({1})), Image("chart.png", "a <chart>")]


def test_markdown_and_html_from_the_same_blocks(tmp_path: Path) -> None:
    images = {"chart.png": PNG_SIGNATURE + b"rest"}
    assert write_pages(str(tmp_path), BLOCKS, "T & t", images, stem="page") == ["page.md", "page.html"]
    markdown = (tmp_path / "page.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Title\n\nMade by `gaplan probe`; **B\\* is** 35.\n\n- one\n- **two**\n\n")
    assert "| a\\|b |     1 |" in markdown and markdown.endswith("![a <chart>](chart.png)\n")
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    for expected in ("<title>T &amp; t</title>", "<h1>Title</h1>", "<code>gaplan probe</code>", "<strong>B* is</strong>",
                     "<li><strong>two</strong></li>", '<td class="num">22</td>', 'alt="a &lt;chart&gt;"',
                     "data:image/png;base64,"):
        assert expected in page, expected
    assert 'src="http' not in page and "href=" not in page and "<script" not in page


def test_an_image_that_was_not_written_is_left_out_of_the_page(tmp_path: Path) -> None:
    write_pages(str(tmp_path), BLOCKS, "t", {})
    assert "<img" not in (tmp_path / "report.html").read_text(encoding="utf-8")


def test_markdown_table_pads_and_aligns() -> None:
    assert markdown_table(["a", "bb"], [["x", "1"]], frozenset({1})).splitlines() == [
        "| a   |  bb |", "| --- | --: |", "| x   |   1 |"]
