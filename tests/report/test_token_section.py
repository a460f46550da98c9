"""A ``--batch-by tokens`` run folder's report: tokens.json's profile and T*, the lengths chart, token vs samples plan."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from gaplan.core.errors import GaplanError
from gaplan.core.lines import histogram_lines, token_bench_lines
from gaplan.report import write_report
from gaplan.runs.schema import THROUGHPUT, check_tokens, read_table, write_table

from .runs import PNG_SIGNATURE, TRIALS, plan_json

TOKENS = {
    "workload": {"model": "tiny-gpt2", "seq_len": 256}, "device": "cpu", "memory_limit_bytes": 512 * 2**20,
    "data": {"path": "corpus.txt", "tokenizer": "bytes", "read": 4000, "samples": 4000},
    "profile": {"count": 4000, "shortest": 4, "longest": 256, "median": 32.0, "p90": 92.0, "p99": 195.0, "mean": 43.9,
                "histogram": [[4, 29, 1858], [30, 55, 1140], [56, 81, 476], [82, 107, 248], [108, 133, 119],
                              [134, 159, 70], [160, 185, 39], [186, 211, 23], [212, 237, 12], [238, 256, 15]]},
    "length_counts": [[4, 50], [16, 900], [32, 1500], [64, 1000], [128, 400], [200, 135], [256, 15]],
    "token_budget": {"token_budget": 1920, "granule": 64, "shortest": 4, "longest": 256, "short_edge": 491,
                     "long_edge": 7, "binding": "shortest"},
}

ROWS = [
    {"split": "T* = 1920 tokens", "kind": "token-plan", "micro_batch": 120, "grad_accum_steps": 8,
     "effective_batch": 256, "samples_per_s": 20.8, "tokens_per_s": 987.0, "peak_bytes": 737 * 2**20,
     "fits_budget": True, "bounded": True, "batch_by": "tokens", "token_budget": 1920, "micro_steps_mean": 7.7,
     "padding_fraction": 0.12, "tokens_ratio": 1.76, "note": "median of 3 fresh run(s) under the enforced budget"},
    {"split": "B* = 7 samples", "kind": "samples-plan", "micro_batch": 7, "grad_accum_steps": 37,
     "effective_batch": 256, "samples_per_s": 11.9, "tokens_per_s": 562.0, "peak_bytes": 684 * 2**20,
     "fits_budget": True, "bounded": True, "batch_by": "samples", "token_budget": None, "micro_steps_mean": 37.0,
     "padding_fraction": 0.583, "tokens_ratio": 1.0, "note": ""},
]


def token_folder(tmp_path: Path, tokens: dict, rows: list[dict] | None = None) -> Path:
    (tmp_path / "plan.json").write_text(json.dumps(plan_json(TRIALS)))
    (tmp_path / "tokens.json").write_text(json.dumps(tokens))
    if rows:
        write_table(str(tmp_path), THROUGHPUT, rows)
    return tmp_path


@pytest.mark.parametrize("rows", [None, ROWS])
def test_the_report_shows_the_profile_t_star_and_the_comparison(tmp_path: Path, rows) -> None:
    folder = token_folder(tmp_path, TOKENS, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = write_report(str(folder))
    assert "lengths.png" in written.files
    assert (folder / "lengths.png").read_bytes()[:8] == PNG_SIGNATURE
    text = (folder / "report.md").read_text()
    assert "## Token budget" in text and "![Sample lengths](lengths.png)" in text
    assert "4000 samples of 4 to 256 tokens: median 32, p90 92, p99 195, mean 43.9" in text
    assert "T\\* = 1920 tokens per micro-batch (granule 64)" in text
    assert "| 238-256          |      15 |" in text
    assert ("### Token plan vs samples plan" in text) == bool(rows)
    if rows:
        assert "1.76x" in text and "58.3%" in text and "12.0%" in text


def test_a_token_plan_without_length_counts_draws_the_profile_bins(tmp_path: Path) -> None:
    tokens = {k: v for k, v in TOKENS.items() if k != "length_counts"}
    folder = token_folder(tmp_path, tokens)
    write_report(str(folder))
    assert (folder / "lengths.png").read_bytes()[:8] == PNG_SIGNATURE


def test_older_throughput_files_read_without_the_token_columns(tmp_path: Path) -> None:
    old = [{k: v for k, v in row.items() if k not in ("batch_by", "token_budget", "micro_steps_mean",
                                                       "padding_fraction", "tokens_ratio")} for row in ROWS]
    write_table(str(tmp_path), THROUGHPUT, old)
    frame = read_table(str(tmp_path), THROUGHPUT)
    assert frame["padding_fraction"].isna().all() and (frame["batch_by"] == "").all()


@pytest.mark.parametrize("change, message", [
    ({"token_budget": None}, "missing token_budget"),
    ({"profile": {"count": 3}}, "missing profile.shortest"),
    ({"token_budget": {**TOKENS["token_budget"], "granule": "64"}}, "token_budget.granule must be a number"),
    ({"length_counts": [[4, "x"]]}, "length_counts must be a list of lists of integers"),
])
def test_a_broken_token_plan_is_one_line(change: dict, message: str) -> None:
    with pytest.raises(GaplanError, match=message.replace(".", r"\.")):
        check_tokens({**TOKENS, **change}, "tokens.json")


def test_text_lines() -> None:
    lines = histogram_lines([(4, 29, 100), (30, 55, 50), (56, 81, 0), (82, 107, 1)], width=10)
    assert lines == ["    4-29  ##########  100", "   30-55  #####       50", "   56-81              0",
                     "  82-107  #           1"]
    table = token_bench_lines(ROWS)
    assert "real tokens/s" in table[0] and "1.76x" in table[1] and "58.3%" in table[2]
