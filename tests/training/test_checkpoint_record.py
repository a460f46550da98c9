"""A checkpoint's own record of its workload against the run's: what an older gaplan wrote as given (a typed option's
text, ``--lora-targets "q_proj, v_proj"``) reads as today's form, and a record of another workload is still refused."""

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.runs.folder import CHECKPOINT
from gaplan.training.checkpoint import check_checkpoint_record
from gaplan.workload.spec import WorkloadSpec

SPEC = WorkloadSpec(model="tiny-llama", seq_len=16, lora=True, lora_targets="q_proj,v_proj", loss="chunked:64")


def _record(tmp_path, **changes) -> str:
    workload = {**SPEC.to_dict(), **changes}
    torch.save({"step": 1, "workload": workload, "data": {}}, tmp_path / CHECKPOINT)
    return str(tmp_path)


def test_an_older_records_text_reads_as_todays_form(tmp_path):
    run = _record(tmp_path, lora_targets="q_proj, v_proj")
    check_checkpoint_record(run, SPEC.to_dict(), {})


@pytest.mark.parametrize("changes", [dict(lora_targets="q_proj"), dict(lora_r=8), dict(model="tiny-gpt2")])
def test_a_record_of_another_workload_is_refused(tmp_path, changes):
    run = _record(tmp_path, **changes)
    with pytest.raises(GaplanError, match="is not this run's"):
        check_checkpoint_record(run, SPEC.to_dict(), {})
