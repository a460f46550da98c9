"""save_model writes a folder transformers loads (weights, config, tokenizer), atomically; nothing half-written."""

import os
import stat

import pytest
import torch
import transformers

from gaplan.core.errors import GaplanError
from gaplan.workload.build import WorkloadSpec, build_workload
from gaplan.workload.model_io import check_save_path, save_model
from tests.model_folders import make_gpt2_folder, make_llama_folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("llama") / "model")


def load_back(folder, auto=transformers.AutoModelForCausalLM):
    return auto.from_pretrained(folder, local_files_only=True)


def test_a_changed_weight_round_trips_with_the_tokenizer(llama, tmp_path):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16), "cpu")
    with torch.no_grad():
        workload.model.model.layers[1].mlp.up_proj.weight[3, 5] += 1.0  # what training would do
    out = save_model(workload, str(tmp_path / "ft"))
    assert out == str(tmp_path / "ft")
    assert "model.safetensors" in os.listdir(out) and "config.json" in os.listdir(out)
    loaded = load_back(out)
    saved = loaded.state_dict()
    for key, tensor in workload.model.state_dict().items():
        assert torch.equal(saved[key], tensor), key
    assert loaded.config.use_cache is True  # training's use_cache=False is not what the saved model says
    assert workload.model.config.use_cache is False  # and the training model keeps it off
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    original = transformers.AutoTokenizer.from_pretrained(llama, local_files_only=True)
    text = "gradient accumulation, hello world"
    assert tokenizer(text)["input_ids"] == original(text)["input_ids"]
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token) == ("<pad>", "</s>", "<s>")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temp folder left behind


def test_saving_again_replaces_the_model_folder(llama, tmp_path):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16), "cpu")
    out = save_model(workload, str(tmp_path / "ft"))
    with torch.no_grad():
        workload.model.lm_head.weight.zero_()
    save_model(workload, out)
    assert torch.count_nonzero(load_back(out).lm_head.weight) == 0
    assert sorted(os.listdir(tmp_path)) == ["ft"]


def test_tied_weights_survive(tmp_path):
    folder = make_gpt2_folder(tmp_path / "gpt2")
    workload = build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    with torch.no_grad():
        workload.model.transformer.wte.weight[7].fill_(0.5)
    loaded = load_back(save_model(workload, str(tmp_path / "ft")))
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert torch.equal(loaded.lm_head.weight[7], torch.full((64,), 0.5))


def test_a_random_init_preset_saves_without_a_tokenizer(tmp_path):
    workload = build_workload(WorkloadSpec(model="tiny-bert-cls", seq_len=16), "cpu")
    out = save_model(workload, str(tmp_path / "cls"))
    loaded = load_back(out, transformers.AutoModelForSequenceClassification)
    assert torch.equal(loaded.classifier.weight, workload.model.classifier.weight)
    assert not any(name.startswith("tokenizer") for name in os.listdir(out))


def test_bf16_master_weights_save_as_bf16(llama, tmp_path):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16, weights_dtype="bf16"), "cpu")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(save_model(workload, str(tmp_path / "bf16")),
                                                               dtype="auto", local_files_only=True)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.lm_head.weight, workload.model.lm_head.weight)


def test_an_unwritable_path_is_one_line_and_leaves_nothing(llama, tmp_path):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16), "cpu")
    if os.geteuid() == 0:  # root writes into read-only folders, not into /proc
        with pytest.raises(GaplanError) as caught:
            save_model(workload, "/proc/gaplan-test-model")
        assert "\n" not in str(caught.value) and "cannot write the model to /proc/gaplan-test-model" in str(caught.value)
        assert not [n for n in os.listdir("/proc") if "gaplan-test-model" in n]
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(GaplanError) as caught:
            save_model(workload, str(locked / "ft"))
        assert "\n" not in str(caught.value) and "cannot write the model to" in str(caught.value)
        assert os.listdir(locked) == []
    finally:
        locked.chmod(stat.S_IRWXU)


def test_a_path_under_a_file_is_one_line_and_leaves_nothing(llama, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16), "cpu")
    with pytest.raises(GaplanError) as caught:
        save_model(workload, str(blocker / "ft"))
    assert "\n" not in str(caught.value) and "cannot write the model to" in str(caught.value)
    with pytest.raises(GaplanError, match="it is a file"):
        save_model(workload, str(blocker))
    assert sorted(os.listdir(tmp_path)) == ["a-file"] and blocker.read_text() == "not a folder"


def test_a_failure_while_writing_leaves_nothing_and_keeps_the_old_folder(llama, tmp_path, monkeypatch):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16), "cpu")
    out = save_model(workload, str(tmp_path / "ft"))
    before = sorted(os.listdir(out))

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(workload.model), "save_pretrained", disk_full)
    with pytest.raises(GaplanError, match="No space left on device"):
        save_model(workload, out)
    assert sorted(os.listdir(tmp_path)) == ["ft"] and sorted(os.listdir(out)) == before


def test_a_folder_of_other_files_is_not_overwritten(llama, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16), "cpu")
    with pytest.raises(GaplanError, match="not overwritten"):
        save_model(workload, str(tmp_path / "notes"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_check_save_path_fails_early_and_writes_nothing(tmp_path):
    assert check_save_path(str(tmp_path / "new" / "ft")) == str(tmp_path / "new" / "ft")
    assert os.listdir(tmp_path / "new") == []  # the parent may be made; nothing is left in it
    (tmp_path / "a-file").write_text("x")
    for bad in (tmp_path / "a-file", tmp_path / "a-file" / "ft", "/proc/gaplan-test-model"):
        with pytest.raises(GaplanError, match="cannot write the model to") as caught:
            check_save_path(str(bad))
        assert "\n" not in str(caught.value)
