"""docs/estimate-vs-published.md stays true to its data: the table is what the results file renders to, every
published row names its source and its kind, and the median and worst error the page states are the file's."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "estimate-vs-published.md"
ROWS = json.loads((ROOT / "docs" / "data" / "published_gpu.json").read_text())
RESULTS = json.loads((ROOT / "docs" / "data" / "published_gpu_results.json").read_text())
BLOCK = re.compile(r"<!-- generated: docs/data/published_gpu_results.json -->\n(.*?)\n<!-- end generated -->", re.S)


def _script():
    spec = importlib.util.spec_from_file_location("published_gpu_check", ROOT / "examples" / "published_gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_table_is_what_the_results_file_renders_to():
    (block,) = BLOCK.findall(PAGE.read_text())
    assert block == _script().render_table(RESULTS)


def test_every_row_names_its_source_and_what_it_measured():
    assert len(ROWS) >= 20
    assert len({r["id"] for r in ROWS}) == len(ROWS)
    for row in ROWS:
        source = row["source"]
        assert re.fullmatch(r"[0-9a-f]{40}", source.get("commit", "")) or source.get("url", "").startswith("https://")
        assert row["kind"] in ("allocated", "reserved", "nvidia-smi")
        assert row["quote"] and str(row["published"]["value"]).rstrip("0").rstrip(".") in row["quote"]
        assert row["expressible"] or row["why_not"]
        assert (ROOT / row["config"] / "config.json").is_file()


def test_the_results_cover_every_row_once():
    ids = [r["id"] for r in RESULTS["rows"]] + [r["id"] for r in RESULTS["not_expressible"]]
    assert sorted(ids) == sorted(r["id"] for r in ROWS)


def test_the_median_and_worst_error_the_page_states_are_the_results_files():
    text = PAGE.read_text()
    stated = _script().summary(RESULTS)
    assert stated == RESULTS["summary"]
    assert f"median absolute error is {stated['median_abs_error_pct']}%" in text
    assert f"`{stated['worst_id']}`, {stated['worst_error_pct']:+.1f}%" in text
    assert f"{stated['within_5_pct']} of {stated['rows']} expressible rows" in text


@pytest.mark.heavy
@pytest.mark.slow
def test_a_row_estimates_as_recorded():
    """One BERT-large row re-traced (about 20 s on 2 cores): the trace is the same on every machine."""
    recorded = next(r for r in RESULTS["rows"] if r["id"] == "hf-bert-gc-fp16-adam8bit")
    row = next(r for r in ROWS if r["id"] == recorded["id"])
    assert _script().estimate_row(row)["estimated_bytes"] == recorded["estimated_bytes"]
