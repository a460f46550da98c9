"""gaplan.core.outputs: what an output path may be, checked before any work."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from gaplan.cli.main import main
from gaplan.core.errors import GaplanError
from gaplan.core.outputs import absolute_if_here, check_weights_file


def test_a_weights_file_is_written_over_only_when_it_holds_safetensors_weights(tmp_path):
    """--save-weights wrote over any file: another run's checkpoint.pt or train.json, a CSV, and exited 0."""
    weights = tmp_path / "w.safetensors"
    save_file({"x": torch.ones(2)}, str(weights))
    check_weights_file(str(weights))  # a re-export replaces the last one
    check_weights_file(str(tmp_path / "new.safetensors"))
    for name, content in (("train.json", b'{"workload": {}}'), ("checkpoint.pt", b"PK\x03\x04zip"),
                          ("log.csv", b"step,loss\n"), ("empty", b""), ("short.safetensors", b"\x08\x00\x00")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(GaplanError, match="holds something other than safetensors weights; not overwritten"):
            check_weights_file(str(tmp_path / name))
        assert (tmp_path / name).read_bytes() == content


def test_save_weights_into_the_runs_own_file_or_over_another_runs_file_is_refused_before_any_work(tmp_path):
    train = ["train", "--seq-len", "16", "--effective-batch", "4", "--steps", "1", "--threads", "1", "--quiet"]
    own = CliRunner().invoke(main, [*train, "--out", str(tmp_path / "a"), "--save-weights",
                                    str(tmp_path / "a" / "checkpoint.pt")])
    assert own.exit_code == 2 and "is the run folder's own checkpoint.pt, which the run writes" in own.output
    assert not (tmp_path / "a").exists()
    folder = CliRunner().invoke(main, [*train, "--out", str(tmp_path / "a"), "--save-model", str(tmp_path / "a")])
    assert folder.exit_code == 2 and "--save-model" in folder.output and "is the run folder itself" in folder.output
    assert not (tmp_path / "a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "train.json").write_text(json.dumps({"workload": {}}))
    other = CliRunner().invoke(main, [*train, "--out", str(tmp_path / "c"), "--save-weights",
                                      str(tmp_path / "b" / "train.json")])
    assert other.exit_code == 2 and "not overwritten" in other.output, other.output
    assert json.loads((tmp_path / "b" / "train.json").read_text()) == {"workload": {}}


def test_a_path_is_made_absolute_only_when_it_names_something_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.txt").write_text("x")
    assert absolute_if_here("data.txt") == str(tmp_path / "data.txt")
    assert absolute_if_here("bytes") == "bytes" and absolute_if_here("tiny-gpt2") == "tiny-gpt2"
    assert absolute_if_here(None) is None and absolute_if_here("/a/b") == "/a/b"
    from gaplan.data.source import DataSource
    from gaplan.workload.spec import WorkloadSpec

    (tmp_path / "bytes").mkdir()  # a folder named as the byte tokenizer, or as a preset, changes neither
    (tmp_path / "tiny-gpt2").mkdir()
    source = DataSource(path="data.txt", tokenizer="bytes")
    assert source.path == str(tmp_path / "data.txt") and source.tokenizer == "bytes"
    assert WorkloadSpec(model="tiny-gpt2").model == "tiny-gpt2"
    (tmp_path / "my-model").mkdir()
    assert WorkloadSpec(model="my-model").model == str(tmp_path / "my-model")
