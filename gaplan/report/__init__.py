"""Reports: a readable report of a saved run folder, from its CSV and JSON files alone.

``write_report(DIR)`` reads ``plan.json`` (and ``throughput.csv``, ``breakdown.csv``,
``train_log.csv`` when present) and writes ``probe.csv``, PNG charts, ``report.md``
and a self-contained ``report.html`` next to them. No model, no device, no torch:
a report can be made on any machine from a copied folder.

* :mod:`~gaplan.report.load` -- the folder read into :class:`RunData`, and the facts derived from it;
* :mod:`~gaplan.report.charts` -- the matplotlib figures and :func:`write_charts`;
* :mod:`~gaplan.report.document` -- blocks, rendered to Markdown and HTML, and :func:`write_pages`;
* :mod:`~gaplan.report.sections` -- the report's sections as blocks.
"""

from gaplan.core.lazy import lazy_exports

_EXPORTS = {
    "Block": ".document",
    "Bullets": ".document",
    "Heading": ".document",
    "Image": ".document",
    "MemoryFit": ".load",
    "Paragraph": ".document",
    "ReportFiles": ".write",
    "RunData": ".load",
    "Table": ".document",
    "breakdown_figure": ".charts",
    "has_rows": ".load",
    "lengths_figure": ".charts",
    "load_run": ".load",
    "markdown_table": ".document",
    "memory_figure": ".charts",
    "memory_fit": ".load",
    "reference_row": ".load",
    "render_html": ".document",
    "render_markdown": ".document",
    "report_blocks": ".sections",
    "throughput_figure": ".charts",
    "training_figure": ".charts",
    "write_charts": ".charts",
    "write_csv": ".write",
    "write_pages": ".document",
    "write_report": ".write",
    "write_text": ".document",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
