"""gaplan.report.layout_report: the split, the peak, the caveat and the trade-offs of ``gaplan plan``'s pick, whole in
the saved files, and a chart that clips nothing and keeps its labels off the usable line."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from gaplan.plan.layouts import Layout, LayoutComparison, LayoutResult
from gaplan.report.layout_report import (
    caveat_lines,
    layouts_figure,
    layouts_frame,
    pick_line,
    table_text,
    tradeoff_lines,
    write_layout_report,
)

GiB = 2**30
MiB = 2**20
LONG_NOTE = ("llama-2-7b does not fit in 79.08 GiB: weights, gradients and optimizer states with the optimizer step's "
             "temporaries take 150.62 GiB before any activation; shard it over ranks: --parallel fsdp --world-size N "
             "(gaplan plan compares the layouts) -- the end of this note must survive")
CHECK = "gaplan probe --model llama-2-7b --seq-len 4096 --dtype bf16 --parallel fsdp --world-size 8 --effective-batch 512"


def layout(machinery: str, precision: str = "fp32-master", grad_sync: str = "every") -> Layout:
    parallel = "ddp" if machinery == "ddp" else "fsdp"
    return Layout(machinery=machinery, precision=precision, parallel=parallel,
                  grad_checkpointing=machinery == "fsdp+ckpt", cpu_offload=machinery == "fsdp+offload",
                  weights_dtype="fp32" if precision == "fp32-master" else "bf16", dtype="bf16",
                  grad_sync=grad_sync if parallel == "fsdp" else "last")


def fits(machinery: str, micro_batch: int, steps: int, edge: int, peak: float, edge_peak: float,
         precision: str = "fp32-master", **extra) -> LayoutResult:
    return LayoutResult(layout(machinery, precision), "label", fits=True, peak_bytes=int(peak * GiB),
                        edge_peak_bytes=int(edge_peak * GiB), max_micro_batch=edge, micro_batch=micro_batch,
                        grad_accum_steps=steps, world_size=8, command="torchrun ... --micro-batch 22", check_command=CHECK,
                        extra=extra)


def seven_b(pick_peak: float = 76.5, margin: float = 0.0) -> LayoutComparison:
    """The 7B plan of issue 20, on 8 x H100 80 GB: the pick runs 22,21,21 per rank, B* 25."""
    other = {"grad_sync": "last", "fits": True, "max_micro_batch": 16, "grad_accum_steps": 4}
    results = [
        LayoutResult(layout("ddp"), "label", fits=False, needed_bytes=int(150.62 * GiB), world_size=8, note=LONG_NOTE),
        LayoutResult(layout("ddp", "pure-low"), "label", fits=False, needed_bytes=int(88.11 * GiB), world_size=8),
        fits("fsdp", 2, 32, 2, 63.95, 63.95),
        fits("fsdp+ckpt", 22, 3, 25, pick_peak, 78.38, other_grad_sync=other),
        fits("fsdp+ckpt", 22, 3, 27, 75.0, 77.53, precision="pure-low"),
    ]
    return LayoutComparison(model="llama-2-7b", param_count=6_738_400_000, seq_len=4096, device_kind="cuda",
                            target="h100-80gb", memory_limit_bytes=80 * GiB, usable_bytes=int(79.08 * GiB),
                            world_size=8, nodes=1, effective_batch=512, dtype="bf16", results=results, margin=margin)


def test_an_uneven_split_is_written_out_in_the_table_the_pick_and_the_saved_files(tmp_path):
    comparison = seven_b()
    table = table_text(layouts_frame(comparison))
    assert "22,21,21 x 8" in table and "22 x 3 x 8" not in table and "2 x 32 x 8" in table
    line = pick_line(comparison)
    assert "split 22,21,21 x 8 = 512 (3 accumulation steps of micro-batches 22, 21, 21 on each of 8 rank(s))" in line
    write_layout_report(str(tmp_path), comparison)
    assert "22,21,21 x 8" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "layouts.json").read_text())["pick"]["split"] == "22,21,21 x 8"
    rows = list(csv.DictReader((tmp_path / "layouts.csv").open()))
    assert rows[0]["split"] == "22,21,21 x 8" and rows[0]["micro_batch_sizes"] == "22,21,21"


def test_the_peak_is_the_plans_with_b_star_and_its_peak_beside_it():
    comparison = seven_b()
    line = pick_line(comparison)
    assert "peak 76.50 GiB per rank at micro-batch 22 (B* 25 peaks at 78.38 GiB)" in line
    row = layouts_frame(comparison).iloc[0]
    assert (row["peak per rank"], row["B*"], row["peak at B*"]) == ("76.50 GiB", "25", "78.38 GiB")


def test_an_estimated_pick_near_the_limit_says_so_with_margin_and_the_probe_that_checks_it(tmp_path):
    lines = caveat_lines(seven_b(pick_peak=78.38))
    assert "99.1% of the 79.08 GiB usable: within 5% of the limit, from an estimate" in lines[0]
    assert "--margin 0.05" in lines[0] and lines[1] == f"check on the hardware: {CHECK}"
    write_layout_report(str(tmp_path), seven_b(pick_peak=78.38))
    assert CHECK in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "layouts.json").read_text())["caveats"] == lines
    assert caveat_lines(seven_b(pick_peak=70.0)) == []  # 89%: clear of the estimate's error
    assert caveat_lines(seven_b(pick_peak=78.38, margin=0.05)) == []  # the headroom is already kept


def test_the_trade_offs_of_the_pick_are_named():
    lines = tradeoff_lines(seven_b())
    sync = next(line for line in lines if "--grad-sync every" in line)
    assert ("gradients are reduce-scattered on every micro-step, 3x the gradient communication of once per step (3 "
            "accumulation steps); to save 1 accumulation step(s) (--grad-sync last: B* 16, 16 x 4 x 8)") in sync
    ckpt = next(line for line in lines if "--grad-checkpointing on" in line)
    assert "recomputed" in ckpt and "to save 29 accumulation step(s)" in ckpt and "2 x 32 x 8" in ckpt
    assert any("FSDP: each block's parameters are all-gathered" in line and "without FSDP no layout fits" in line
               for line in lines)
    assert not any("pure bf16" in line for line in lines)  # the pick keeps fp32 master weights


@pytest.mark.parametrize("timed", [False, True])
def test_a_pick_that_saves_no_step_says_why_it_won_measured_or_not(timed):
    """Checkpointing picked at the same steps as the best without it: by the finer precision when only estimated
    (it said "measured faster" where nothing was timed), by the clock when timed (plan --measure)."""
    speed = {"samples_per_s": 10.0} if timed else {}
    chosen = dataclasses.replace(fits("fsdp+ckpt", 22, 3, 25, 70.0, 78.0), **speed)
    other = dataclasses.replace(fits("fsdp", 22, 3, 23, 71.0, 78.0, precision="pure-low"),
                                **({"samples_per_s": 9.0} if timed else {}))
    comparison = dataclasses.replace(seven_b(), results=[chosen, other])
    ckpt = next(line for line in tradeoff_lines(comparison) if "--grad-checkpointing on" in line)
    if timed:
        assert "measured faster than the best without checkpointing" in ckpt, ckpt
    else:
        assert "measured" not in ckpt and "the same accumulation steps as the best without checkpointing" in ckpt
        assert f"kept for its finer precision ({chosen.precision_label})" in ckpt, ckpt


def test_each_trade_off_names_the_alternative_it_was_weighed_against_or_that_none_was_compared():
    """A pure bf16 pick is weighed against the best *with* fp32 master weights (it said "best without fp32 master
    weights: <the fp32 one>"); a trade-off no compared layout goes without says so (it said "no layout fits")."""
    bf16 = fits("fsdp+ckpt", 25, 2, 27, 75.0, 77.5, precision="pure-low")
    fp32 = fits("fsdp+ckpt", 17, 3, 25, 76.0, 78.0)
    lines = tradeoff_lines(dataclasses.replace(seven_b(), results=[bf16, fp32]))
    pure = next(line for line in lines if line.startswith("trade-off: pure bf16"))
    assert "to save 1 accumulation step(s) (best with fp32 master weights: " in pure, pure
    ckpt = next(line for line in lines if "--grad-checkpointing on" in line)
    assert ckpt.endswith("no layout without checkpointing was compared (--layouts)"), ckpt
    assert any(line.endswith("no layout without FSDP was compared (--layouts)") for line in lines), lines


def test_saved_reports_never_cut_a_note_but_the_terminal_does(tmp_path):
    comparison = seven_b()
    assert "must survive" not in table_text(layouts_frame(comparison)) and "..." in table_text(layouts_frame(comparison))
    write_layout_report(str(tmp_path), comparison)
    for name in ("report.md", "report.html", "layouts.csv", "layouts.json"):
        assert "the end of this note must survive" in (tmp_path / name).read_text(), name


def test_integer_columns_of_the_csv_are_written_as_integers(tmp_path):
    write_layout_report(str(tmp_path), seven_b())
    rows = list(csv.DictReader((tmp_path / "layouts.csv").open()))
    pick = rows[0]
    assert (pick["max_micro_batch"], pick["micro_batch"], pick["grad_accum_steps"]) == ("25", "22", "3")
    assert pick["peak_bytes"] == str(int(76.5 * GiB)) and pick["needed_bytes"] == ""
    ddp = next(row for row in rows if row["fits"] == "False" and row["needed_bytes"])
    assert ddp["needed_bytes"].isdigit() and ddp["micro_batch"] == ""


def drawn(figure):
    FigureCanvasAgg(figure).draw()
    axes = figure.axes[0]
    return axes, axes.patches, [t for t in axes.texts]


def test_no_bar_is_clipped_and_no_label_sits_on_the_usable_line():
    comparison = seven_b(pick_peak=78.38)
    axes, bars, labels = drawn(layouts_figure(comparison))
    shown = [r for r in comparison.results if r.fits is not None]
    top = axes.get_ylim()[1]
    for bar, result in zip(bars, shown, strict=True):
        value = (result.peak_bytes if result.fits else result.needed_bytes) / GiB
        assert bar.get_y() + bar.get_height() == pytest.approx(value) and value < top
    renderer = axes.figure.canvas.get_renderer()
    line_y = axes.transData.transform((0, 79.08))[1]
    assert len(labels) == len(shown)
    for label in labels:
        box = label.get_window_extent(renderer)
        assert not box.y0 - 1 <= line_y <= box.y1 + 1, label.get_text()


def test_a_tiny_model_on_a_large_card_is_drawn_on_a_log_axis_with_every_bar_readable():
    comparison = seven_b()
    small = [dataclasses.replace(r, peak_bytes=(i + 1) * 90 * MiB, edge_peak_bytes=(i + 1) * 95 * MiB)
             for i, r in enumerate(comparison.results) if r.fits]
    comparison = dataclasses.replace(comparison, model="tiny-llama", results=small)
    axes, bars, _ = drawn(layouts_figure(comparison))
    assert axes.get_yscale() == "log" and "log scale" in axes.get_ylabel()
    for bar in bars:
        (_, y0), (_, y1) = axes.transData.transform([(0, bar.get_y()), (0, bar.get_y() + bar.get_height())])
        assert y1 - y0 > 20  # pixels: a bar, not a hairline at the foot of an 80 GiB axis


def test_a_measured_layout_does_not_show_the_estimates_peak_for_another_b_star():
    comparison = seven_b()
    pick = comparison.pick
    # plan --measure replaces B*, split and peak with the probe's; the estimate's peak at its B* 25 no longer applies.
    measured = dataclasses.replace(pick, max_micro_batch=24, samples_per_s=10.0, extra={**pick.extra, "measured": True})
    comparison = dataclasses.replace(comparison, results=[measured], measured_on="cuda")
    row = layouts_frame(comparison).iloc[0]
    assert row["peak at B*"] == "-" and "peaks at" not in pick_line(comparison)
    assert comparison.to_dict()["pick"]["edge_peak_bytes"] is None and caveat_lines(comparison) == []
    at_edge = dataclasses.replace(measured, max_micro_batch=22)
    assert dataclasses.replace(comparison, results=[at_edge]).to_dict()["pick"]["edge_peak_bytes"] == pick.peak_bytes
