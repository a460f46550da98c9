"""Write a run folder's report (``write_report``), from its CSV and JSON files alone.

``write_report(DIR)`` reads ``plan.json`` (and ``throughput.csv``, ``breakdown.csv``,
``train_log.csv`` when present) and writes ``probe.csv``, PNG charts, ``report.md``
and a self-contained ``report.html`` next to them. No model, no device, no torch:
a report can be made on any machine from a copied folder.

* :mod:`~gaplan.report.load` -- the folder read into :class:`RunData`, and the facts derived from it;
* :mod:`~gaplan.report.charts` -- the matplotlib figures and :func:`write_charts`;
* :mod:`~gaplan.report.document` -- blocks, rendered to Markdown and HTML, and :func:`write_pages`;
* :mod:`~gaplan.report.sections` -- the report's sections as blocks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from gaplan.core.atomic_write import atomic_write
from gaplan.report.charts import (
    breakdown_figure,
    lengths_figure,
    memory_figure,
    throughput_figure,
    training_figure,
    write_charts,
)
from gaplan.report.document import write_pages
from gaplan.report.load import has_rows, load_run
from gaplan.report.sections import report_blocks
from gaplan.report.training_report import report_title
from gaplan.runs.claim import hold_run_folder
from gaplan.runs.folder import (
    BREAKDOWN_PNG,
    LENGTHS_PNG,
    MEMORY_PNG,
    PROBE_CSV,
    REPORT_STEM,
    THROUGHPUT_PNG,
    TRAINING_PNG,
    path_in,
)
from gaplan.runs.schema import write_trials_csv


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote: the folder and the file names in it, sorted."""

    directory: str
    files: list[str]


def write_report(run_dir: str) -> ReportFiles:
    """Read ``run_dir`` and write probe.csv, the charts, report.md and report.html into it.

    A folder of ``--batch-by tokens`` (with ``tokens.json``) also gets the lengths histogram and its section.

    The memory chart needs probe trials: a plan made with ``--micro-batch`` gets none. The folder is held as its
    only writer meanwhile (:func:`gaplan.runs.claim.hold_run_folder`): a run still writing it is one line.
    """
    if not os.path.isdir(run_dir):
        return _write_report(run_dir)  # load_run says what is wrong with it
    with hold_run_folder(run_dir, what="run folder"):
        return _write_report(run_dir)


def _write_report(run_dir: str) -> ReportFiles:
    run = load_run(run_dir)
    written: list[str] = []

    write_trials_csv(run_dir, run.plan.get("trials") or [])
    written.append(PROBE_CSV)

    charts: list[tuple[str, Figure]] = []
    if run.probed:
        charts.append((MEMORY_PNG, memory_figure(run)))
    if has_rows(run.breakdown):
        charts.append((BREAKDOWN_PNG, breakdown_figure(run)))
    if run.tokens is not None:
        charts.append((LENGTHS_PNG, lengths_figure(run.tokens, run.model)))
    if has_rows(run.throughput):
        charts.append((THROUGHPUT_PNG, throughput_figure(run)))
    if has_rows(run.train_log):
        charts.append((TRAINING_PNG, training_figure(run)))
    images = write_charts(run_dir, charts)
    written += list(images)
    blocks = report_blocks(run, images=list(images))
    written += write_pages(run_dir, blocks, report_title(run), images, REPORT_STEM)
    return ReportFiles(directory=run_dir, files=sorted(written))


def write_csv(run_dir: str, name: str, rows: Sequence[dict[str, Any]]) -> None:
    """Any table of rows as ``run_dir/name``, written atomically (the run folder's own tables go through
    :func:`gaplan.runs.schema.write_table`, which checks their columns)."""
    frame = pd.DataFrame(list(rows))
    atomic_write(path_in(run_dir, name), lambda path: frame.to_csv(path, index=False))
