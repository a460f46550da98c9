"""The lever table's rendering (gaplan.report.lever_report) on a synthetic comparison: no trace, no torch."""

import csv
import json

from gaplan.plan.lever_pick import LeverComparison, LeverResult
from gaplan.plan.levers import Base
from gaplan.report.lever_report import (
    COLUMNS,
    header_line,
    lever_records,
    not_compared_lines,
    pick_lines,
    report_dict,
    table_text,
    write_lever_report,
)

MiB = 2**20


def _comparison(measured: bool = False) -> LeverComparison:
    rate = (lambda v, lo, hi: {"samples_per_s": v, "samples_per_s_low": lo, "samples_per_s_high": hi}) if measured \
        else (lambda v, lo, hi: {})
    rows = [
        LeverResult((), True, 6, 6, 3, 900 * MiB, model_seconds=2.0, **rate(30.0, 29.0, 31.0)),
        LeverResult(("ckpt",), True, 16, 16, 1, 700 * MiB, model_seconds=1.6, extra={"capped": True},
                    **rate(31.0, 30.5, 31.5)),
        LeverResult(("sgd",), None, note="loss chunked does not apply"),
        LeverResult(("lion", "ckpt"), False, needed_bytes=2000 * MiB, note="does not fit"),
    ]
    return LeverComparison("tiny-gpt2", "cpu", None, 2**30, 2**30, 16, Base(), rows,
                           not_compared=[("compile", "no --compile yet")], cost_source="rates", workload={"model": "m"})


def test_table_rows_say_fit_split_time_and_cap():
    comparison = _comparison()
    records = lever_records(comparison)
    assert [r["levers"] for r in records] == ["base", "ckpt", "sgd", "lion+ckpt"]
    assert records[0] | {"note": ""} == {"levers": "base", "fits": "yes", "B*": 6, "split": "6,5,5", "steps": 3,
                                         "peak": "900.00 MiB", "time (model)": "1.00x", "samples/s": "-", "note": ""}
    assert (records[1]["B*"], records[1]["time (model)"], records[1]["split"]) == ("16 (cap)", "0.80x", "16 x 1")
    assert records[2]["fits"] == "not estimated" and records[3]["B*"] == "-" and records[3]["time (model)"] == "-"
    text = table_text(comparison)
    assert text.splitlines()[0].split()[:3] == ["levers", "fits", "B*"] and len(text.splitlines()) == 5
    assert "base: --optimizer adamw, --loss plain, checkpointing off" in header_line(comparison)
    assert not_compared_lines(comparison)[0] == "not compared: compile: no --compile yet"
    assert "(cap)" in not_compared_lines(comparison)[1]


def test_pick_lines_name_the_tradeoffs_and_the_rows_within_the_interval():
    modelled = pick_lines(_comparison())
    assert modelled[0].startswith("lever pick: ckpt (the least modelled time): B* 16, 1 accumulation step(s)")
    assert modelled[1] == "  trade-off: every block's forward runs again in backward"
    measured = pick_lines(_comparison(measured=True))
    assert measured[0].startswith("lever pick: ckpt (the fastest measured)")
    assert measured[-1].endswith("as measured): base")
    tied = _comparison()
    tied.results[1].model_seconds = 1.99
    assert pick_lines(tied)[0].startswith("lever pick: base (within 2% of the least modelled time, with fewer levers)")
    records = lever_records(_comparison(measured=True))
    assert records[1]["samples/s"] == "31.0 [30.5-31.5]"


def test_written_files_agree(tmp_path):
    comparison = _comparison(measured=True)
    files = write_lever_report(str(tmp_path), comparison)
    assert files == ["levers.csv", "levers.html", "levers.json", "levers.md"]
    with open(tmp_path / "levers.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(COLUMNS) and [r["levers"] for r in rows] == ["base", "ckpt", "sgd", "lion+ckpt"]
    data = json.loads((tmp_path / "levers.json").read_text())
    assert data == json.loads(json.dumps(report_dict(comparison)))
    assert data["pick"]["label"] == "ckpt" and data["within_interval"] == ["base"] and "rates" in data["cost_model"]
    markdown = (tmp_path / "levers.md").read_text()
    assert "| levers" in markdown and "lever pick: ckpt" in markdown and "not compared: compile" in markdown


def test_the_base_row_says_a_compiled_workload_is_compiled():
    from gaplan.report.lever_report import base_text

    assert base_text(Base()) == "--optimizer adamw, --loss plain, checkpointing off"
    assert base_text(Base(compile=True)).endswith("checkpointing off, compiled")
