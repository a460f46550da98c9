"""A checkpoint's own record of its workload against the run's: what an older gaplan wrote as given (a typed option's
text, ``--lora-targets "q_proj, v_proj"``) reads as today's form, and a record of another workload is still refused;
a file that is not a gaplan checkpoint at all is one line before anything is written."""

import re

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.runs.folder import CHECKPOINT
from gaplan.training.checkpoint import check_checkpoint_record
from gaplan.workload.spec import WorkloadSpec

SPEC = WorkloadSpec(model="tiny-llama", seq_len=16, lora=True, lora_targets="q_proj,v_proj", loss="chunked:64")


SHAPE = {"step": 1, "plan": {}, "rng": {}, "scheduler": {}, "model": {}, "optimizer": {}}  # what every one holds


def _record(tmp_path, **changes) -> str:
    workload = {**SPEC.to_dict(), **changes}
    torch.save({**SHAPE, "workload": workload, "data": {}}, tmp_path / CHECKPOINT)
    return str(tmp_path)


def test_an_older_records_text_reads_as_todays_form(tmp_path):
    run = _record(tmp_path, lora_targets="q_proj, v_proj")
    check_checkpoint_record(run, SPEC.to_dict(), {})


@pytest.mark.parametrize("changes", [dict(lora_targets="q_proj"), dict(lora_r=8), dict(model="tiny-gpt2")])
def test_a_record_of_another_workload_is_refused(tmp_path, changes):
    run = _record(tmp_path, **changes)
    with pytest.raises(GaplanError, match="is not this run's"):
        check_checkpoint_record(run, SPEC.to_dict(), {})


@pytest.mark.parametrize("state, said", [
    (torch.nn.Linear(2, 2).state_dict(), "no 'step' in it"),  # your own state dict, named checkpoint.pt
    ([1, 2], "a list, not the dict gaplan writes"),
    ({**SHAPE, "step": "x"}, "its 'step' is str 'x'"),
    ({**SHAPE, "step": None}, "its 'step' is NoneType"),
    ({**SHAPE, "step": -1}, "its 'step' is int '-1'"),
    ({**SHAPE, "rng": None}, "its 'rng' is NoneType"),
    ({**SHAPE, "scheduler": None}, "its 'scheduler' is NoneType"),
    ({**SHAPE, "loop_state": "x"}, "its 'loop_state' is str 'x'"),
    ({**SHAPE, "data": 5}, "its 'data' is int '5'"),
    ({k: v for k, v in SHAPE.items() if k != "optimizer"}, "no 'optimizer' in it"),
])
def test_a_file_that_is_not_a_gaplan_checkpoint_is_one_line(tmp_path, state, said):
    """Each was a traceback (KeyError 'step', AttributeError, TypeError), some after plan.json was rewritten."""
    from gaplan.training.checkpoint import checkpoint_position, load_checkpoint

    torch.save(state, tmp_path / CHECKPOINT)
    for read in (checkpoint_position, load_checkpoint):
        with pytest.raises(GaplanError, match=f"checkpoint.pt is not a gaplan checkpoint \\({re.escape(said)}"):
            read(str(tmp_path))


def test_a_resume_from_a_foreign_checkpoint_writes_nothing(tmp_path):
    from click.testing import CliRunner

    from gaplan.cli.main import main

    run = tmp_path / "run"
    train = ["train", "--seq-len", "16", "--effective-batch", "4", "--steps", "1", "--threads", "1", "--optimizer",
             "sgd", "--quiet", "--out", str(run)]
    assert CliRunner().invoke(main, train).exit_code == 0
    torch.save(torch.nn.Linear(2, 2).state_dict(), run / CHECKPOINT)
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    result = CliRunner().invoke(main, ["train", "--resume", str(run), "--steps", "2"])
    assert result.exit_code == 2 and "is not a gaplan checkpoint (no 'step' in it)" in result.output, result.output
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before
