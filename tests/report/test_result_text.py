"""The commands' results as lines (gaplan/report/result_text.py): what the CLI prints is these lines, word for word,
and a Python caller gets them too."""

from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.estimate import list_targets
from gaplan.report.result_text import lever_line, target_lines, train_lines

SUMMARY = {"steps": 4, "seconds": 2.5, "loss_first": 5.5, "loss_last": 5.25, "samples_per_s": 12.0,
           "tokens_per_s": 190.0, "peak_bytes": 3 * 2**20}


def test_the_cli_prints_the_known_gpus_as_the_library_lines_them():
    printed = CliRunner().invoke(main, ["estimate", "--list-targets"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == "\n".join(target_lines(list_targets())) + "\n"
    assert printed.output.splitlines()[0].split() == ["target", "memory", "reserve", "usable", "description"]


def test_a_training_runs_peak_says_whether_a_budget_bound_it():
    unbound, bound = train_lines(SUMMARY, "runs/x", bounded=False), train_lines(SUMMARY, "runs/x", bounded=True)
    assert unbound[0].endswith("peak (step) 3.00 MiB with no budget bound; log and checkpoint in runs/x")
    assert bound[0].endswith("peak (step) 3.00 MiB; log and checkpoint in runs/x")
    assert "peak" not in train_lines({**SUMMARY, "peak_bytes": None}, "runs/x", bounded=False)[0]
    schedule = {**SUMMARY, "effective_batches": [{"effective_batch": 8, "from_step": 1},
                                                {"effective_batch": 16, "from_step": 3}]}
    assert train_lines(schedule, "runs/x", bounded=False)[1] == "effective batch: 8 from step 1, 16 from step 3"


class _Lever:
    label, fits, note, max_micro_batch, grad_accum_steps, samples_per_s = "chunked loss", True, "", 12, 3, None


def test_a_lever_row_names_its_edge_and_steps_and_its_rate_once_measured():
    row = _Lever()
    assert lever_line(row) == "  chunked loss: B* 12, 3 step(s)"
    row.samples_per_s = 41.25
    assert lever_line(row) == "  chunked loss: B* 12, 3 step(s), 41.2 samples/s"
    row.fits, row.note = False, ""
    assert lever_line(row) == "  chunked loss: does not fit"


def test_an_interrupted_run_says_where_it_stopped_and_how_it_goes_on():
    cut = {**SUMMARY, "interrupted": True, "last_step": 46, "steps_total": 200}
    assert train_lines(cut, "runs/x", bounded=False)[-1] == (
        "interrupted at step 46 of 200: checkpointed; gaplan train --resume runs/x goes on")
    assert "interrupted" not in " ".join(train_lines(SUMMARY, "runs/x", bounded=False))
    before_any = {**SUMMARY, "steps": 0, "interrupted": True, "loss_first": None, "loss_last": None}
    assert train_lines(before_any, "runs/x", bounded=False) == [
        "interrupted before its first step ended: nothing trained in runs/x"]
