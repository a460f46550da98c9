"""Where ``gaplan probe`` starts: from a trusted estimate (a family in the zoo, one process), else from 1."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.workflows.probe import estimate_is_trusted
from gaplan.workload.spec import WorkloadSpec


def falcon_folder(path) -> str:
    import transformers

    transformers.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128).save_pretrained(
        path)
    return str(path)


def test_the_estimate_seeds_the_probe_where_the_zoo_measured_the_family(tmp_path):
    assert estimate_is_trusted(WorkloadSpec(model="tiny-gpt2"), "cpu", 1)
    assert estimate_is_trusted(WorkloadSpec(model="tiny-llama", lora=True), "cuda:0", 1)
    assert not estimate_is_trusted(WorkloadSpec(model="tiny-gpt2"), "cpu", 2)  # the zoo measured one process
    assert not estimate_is_trusted(WorkloadSpec(model="tiny-gpt2", compile=True), "cpu", 1)  # and no compiler in it
    assert not estimate_is_trusted(WorkloadSpec(model="tiny-llama", lora=True, quantize="4bit"), "cpu", 1)
    assert not estimate_is_trusted(WorkloadSpec(model=falcon_folder(tmp_path / "falcon")), "cpu", 1)


@pytest.mark.slow
@pytest.mark.parametrize("flag, seeded", [(None, True),
                                         pytest.param("--no-seed-from-estimate", False, marks=pytest.mark.heavy)])
def test_a_plain_probe_of_a_zoo_family_starts_at_the_estimate_unless_told_not_to(tmp_path, flag, seeded):
    args = ["probe", "--model", "tiny-gpt2", "--seq-len", "16", "--memory-limit", "256MiB", "--device", "cpu",
            "--threads", "1", "--effective-batch", "8", "--json", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(main, args + ([flag] if flag else []), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["estimate_seed"] is not None) == seeded
    if seeded:  # the search starts at the estimate's edge (here above E = 8, the search's cap): its first trial
        assert data["trials"][0]["micro_batch"] == min(data["estimate_seed"], 8)
    else:
        assert data["trials"][0]["micro_batch"] == 1
    assert ("estimate: B* =" in result.stderr) == seeded
