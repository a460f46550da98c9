"""The report's text: what each section says, for a probed run and for a plan made with ``--micro-batch``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gaplan.report import write_report
from tests.report.runs import BUDGET, TRIALS, make_run, plan_json, throughput_rows, trial, unprobed_plan_json


def report_text(directory: Path) -> str:
    write_report(str(directory))
    return (directory / "report.md").read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    return text.split(f"## {heading}")[1].split("\n## ")[0]


@pytest.fixture(scope="module")
def full_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    return report_text(make_run(tmp_path_factory.mktemp("sections") / "run"))


def test_markdown_content(full_text: str) -> None:
    for expected in ("# gaplan training report: tiny-gpt2", "5.5M parameters", "causal-lm", "sequence length 128", "fp32",
                     "adamw",
                     "1.00 GiB (the device default)", "torch 2.13.0+cpu", "2026-11-29T08:22:21+00:00",
                     "effective batch 256 = micro-batch 32 x 8 accumulation steps x world size 1   (sizes 32 x8)",
                     "## Tuner decision", "4% above", "## Probe trials", "## Throughput", "## Memory breakdown",
                     "## Training", "true large batch (over the budget: timed for reference, does not fit)", "![",
                     "(memory.png)", "(training.png)",
                     "1.17x", "10.9 at the first step, 6.8 at the last", "**Probe:** 7 trials in 39.2 s"):
        assert expected in full_text, expected
    large = next(line for line in section(full_text, "Throughput").splitlines() if line.startswith("| 256x1 "))
    assert [cell.strip() for cell in large.split("|")][-3:-1] == ["no", "measured without the budget"], large
    table_rows = [line for line in section(full_text, "Probe trials").splitlines() if line.startswith("|")]
    assert len(table_rows) == 2 + len(TRIALS)  # header, rule, one row per trial
    assert sum(" OOM " in line for line in table_rows) == sum(not t["fits"] for t in TRIALS)


def test_oom_cell_gives_a_readable_reason(tmp_path: Path) -> None:
    cuda_oom = {**trial(48, False), "completed_steps": 1,
                "error": "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.11 GiB of wh"}
    make_run(tmp_path, full=False, plan=plan_json([*TRIALS, cuda_oom]))
    rows = throughput_rows()
    rows[2].update(samples_per_s=None, fits_budget=False, note="out of memory: DefaultCPUAllocator: can't allocate mem")
    pd.DataFrame(rows).to_csv(tmp_path / "throughput.csv", index=False)
    text = report_text(tmp_path)
    probe = section(text, "Probe trials")
    assert probe.count("out of memory (CPU allocator) at optimizer step 1") == 2
    assert "out of memory (CUDA) at optimizer step 2" in probe
    assert "out of memory (CPU allocator) |" in section(text, "Throughput")
    assert "DefaultCPUAllocator" not in text and "Tried to allocate" not in text


def test_breakdown_says_what_other_holds(full_text: str) -> None:
    breakdown = section(full_text, "Memory breakdown")
    assert "other (temporaries: logits, loss buffers, optimizer-step scratch)" in breakdown
    assert "| optimizer states |" in breakdown


def test_plan_without_optional_fields(tmp_path: Path) -> None:
    data = plan_json(TRIALS)
    for key in ("torch_version", "tuner", "probe_limit_bytes"):
        del data[key]
    text = report_text(make_run(tmp_path, full=False, plan=data))
    assert "torch version not recorded" in text and "## Tuner decision" not in text
    assert "1.00 GiB (the device default)" in text and "probed under" not in text


@pytest.mark.parametrize("memory_limit, budget", [(None, "**Memory budget:** none (no probe ran)"),
                                                  (BUDGET, "**Memory budget:** 1.00 GiB (set by the user)")])
def test_a_plan_made_with_micro_batch_says_no_probe_ran(tmp_path: Path, memory_limit: int | None, budget: str) -> None:
    make_run(tmp_path, plan=unprobed_plan_json(memory_limit))
    rows = throughput_rows()
    rows[3].update(note="measured unbounded for reference")
    pd.DataFrame(rows).to_csv(tmp_path / "throughput.csv", index=False)
    text = report_text(tmp_path)
    for expected in (budget, "No probe ran: the micro-batch 8 was given with `--micro-batch`", "5.5M parameters",
                     "**Task:** causal-lm", "**Largest micro-batch:** 8, given with `--micro-batch` (not probed)",
                     "**Probe:** none", "true large batch (no probe: whether it fits is unknown)", "unknown (no probe)",
                     "## Throughput", "## Training"):
        assert expected in text, expected
    for absent in ("0 B", "Task:** ?", "unknown parameters", "B\\*", "## Probe trials", "memory.png", "does not fit the",
                   "no (run without", "Peak at", "Static memory"):
        assert absent not in text, absent


def test_an_older_plan_made_without_a_probe(tmp_path: Path) -> None:
    """Before ``probed`` was recorded, such plans said 0 B, task "?" and 0 parameters."""
    data = {**plan_json([]), "memory_limit_bytes": 0, "probe_limit_bytes": 0, "param_count": 0, "static_bytes": 0,
            "task": "?"}
    data["workload"]["task"] = "?"
    text = report_text(make_run(tmp_path, full=False, plan=data))
    assert "No probe ran" in text and "**Memory budget:** none" in text and "**Task:** unknown" in text
    assert "0 B" not in text and "Task:** ?" not in text
