"""One row per GPU check for ``tests/gpu/gpu_check.sh``: the check, pass/fail/skip, and what it measured.

A check records its measurement with ``record_property("measured", text)`` (pytest's own channel to the report); a
failed check without one shows the last line of its error instead. Rows go to stdout and, when
``GAPLAN_GPU_TABLE`` names a file, to that file too.
"""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if item.get_closest_marker("gpu") is not None:  # the checks of the script itself run on any machine
        _write_row(report)


def _write_row(report) -> None:
    if report.when != "call" and report.passed:
        return  # setup and teardown that went well say nothing
    if report.when == "teardown" and report.skipped:
        return
    measured = "; ".join(str(value) for name, value in report.user_properties if name == "measured")
    if report.failed and not measured:
        lines = str(report.longrepr).strip().splitlines()
        measured = lines[-1] if lines else "failed"
    if report.skipped and not measured and isinstance(report.longrepr, tuple):  # (file, line, "Skipped: why")
        measured = "skipped: " + str(report.longrepr[-1]).removeprefix("Skipped: ")
    outcome = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[report.outcome]
    row = f"| {report.nodeid.split('::', 1)[-1]} | {outcome} | {measured.replace('|', '/')} |"
    print(f"\nGPU-CHECK {row}", flush=True)
    table = os.environ.get("GAPLAN_GPU_TABLE")
    if table:
        with open(table, "a", encoding="utf-8") as out:
            out.write(row + "\n")
