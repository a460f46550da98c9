"""The training loop: resume equals an uninterrupted run, checkpoints are atomic, OOM fallback is exact."""

import json
import os
import shutil

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.data import SyntheticCorpus
from gaplan.plan.split import make_plan
from gaplan.runs.folder import CHECKPOINT
from gaplan.training.checkpoint import load_checkpoint, save_checkpoint
from gaplan.training.loop import TrainConfig, train
from gaplan.workload.build import WorkloadSpec, build_workload
from tests.tolerances import assert_close_at_scale

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="adamw", lr=1e-3)


def run(tmp_path, name, steps=4, micro=4, resume=False, stop_after=None, wrap_loss=None, spec=SPEC):
    workload = build_workload(spec, "cpu", seed=0)
    if wrap_loss:
        workload.raw_loss = wrap_loss(workload.raw_loss)
    corpus = SyntheticCorpus(16, seed=0)

    def on_step(log):
        if stop_after is not None and log.step == stop_after + 1:
            raise KeyboardInterrupt  # the process dies mid-run, after the checkpoint of step `stop_after`

    config = TrainConfig(steps=steps, seed=0, checkpoint_every=1, run_dir=str(tmp_path / name))
    result = train(workload, make_plan(16, micro), corpus, config, resume=resume, on_step=on_step)
    return workload.model, result


def test_resume_is_bitwise_equal(tmp_path):
    reference, _ = run(tmp_path, "straight")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "cut", stop_after=2)
    assert load_checkpoint(str(tmp_path / "cut"))["step"] == 2
    resumed, result = run(tmp_path, "cut", resume=True)
    assert [log.step for log in result.logs] == [3, 4]
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    rows = (tmp_path / "cut" / "train_log.csv").read_text().splitlines()
    assert len(rows) == 1 + 4, "the log has each step once after a resume"


def test_resume_is_bitwise_equal_with_dropout(tmp_path):
    """Dropout draws from the RNG every step: a resume must go on with the checkpoint's RNG state, not a reseed."""
    from tests.model_folders import _make_folder, gpt2_config

    folder = _make_folder(str(tmp_path / "model"), lambda vocab: gpt2_config(vocab, resid_pdrop=0.1, embd_pdrop=0.1,
                                                                             attn_pdrop=0.1),
                          with_weights=False, with_tokenizer=False, sharded=False, seed=0, vocab_size=300)
    spec = WorkloadSpec(model=folder, seq_len=16, optimizer="adamw", lr=1e-3)
    reference, _ = run(tmp_path, "straight", spec=spec)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "cut", stop_after=2, spec=spec)
    resumed, _ = run(tmp_path, "cut", resume=True, spec=spec)
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_loss_falls_on_the_synthetic_corpus(tmp_path):
    _, result = run(tmp_path, "learn", steps=6)
    assert result.logs[-1].loss < result.logs[0].loss - 0.5


def test_cut_off_checkpoint_is_never_loaded(tmp_path, monkeypatch):
    from tests.training.test_checkpoint_record import SHAPE as shape  # what a checkpoint holds

    path = str(tmp_path / CHECKPOINT)
    save_checkpoint(path, {**shape, "step": 1})
    real_save = torch.save

    def dies_mid_write(obj, path):
        with open(path, "wb") as handle:
            handle.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(GaplanError, match="No space left on device"):
        save_checkpoint(path, {**shape, "step": 2})
    assert os.listdir(tmp_path) == [CHECKPOINT], "the partial temp file was left behind"
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(str(tmp_path))["step"] == 1
    (tmp_path / CHECKPOINT).write_bytes(b"garbage")
    with pytest.raises(GaplanError, match="cannot be read"):
        load_checkpoint(str(tmp_path))


def test_injected_oom_is_survived_with_the_same_weights(tmp_path):
    torch.manual_seed(0)
    # SGD: the update is the gradient itself, so float rounding between splits stays at rounding level
    # (Adam divides by sqrt(v), magnifying rounding on near-zero gradient entries).
    sgd = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="sgd", lr=0.1)
    never, _ = run(tmp_path, "never", steps=3, micro=8, spec=sgd)
    state = {"raised": False}

    def flaky(raw_loss):
        def wrapped(model, batch):
            if not state["raised"] and batch["input_ids"].shape[0] == 8:
                state["raised"] = True
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes (injected)")
            return raw_loss(model, batch)
        return wrapped

    survived, result = run(tmp_path, "oom", steps=3, micro=8, wrap_loss=flaky, spec=sgd)
    assert state["raised"] and len(result.oom_fallbacks) == 1
    assert result.plan.micro_batch == 4 and result.plan.effective_batch == 16
    for a, b in zip(never.state_dict().values(), survived.state_dict().values(), strict=True):
        assert_close_at_scale(a, b)


def test_other_errors_are_not_retried(tmp_path):
    def broken(raw_loss):
        def wrapped(model, batch):
            raise ValueError("a bug, not an OOM")
        return wrapped

    with pytest.raises(ValueError):
        run(tmp_path, "bug", steps=1, wrap_loss=broken)
    assert not os.path.exists(tmp_path / "bug" / CHECKPOINT)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("where", [pytest.param("first", marks=pytest.mark.heavy), "last"])
def test_ranks_switch_together_after_one_rank_runs_out_of_memory(tmp_path, where):
    """Rank 1 alone hits an OOM, in the first micro-step or in the last one's forward (after the first vote);
    both ranks halve the micro-batch and the weights equal a run without it."""
    import json
    import shutil
    import subprocess
    import sys

    from safetensors.torch import load_file

    from tests.conftest import REPO_ROOT, free_port

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    out = str(tmp_path / "ddp.safetensors")
    done = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                           os.path.join(REPO_ROOT, "tests", "scripts", "ddp_oom.py"), out, where],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT))
    assert done.returncode == 0, done.stderr[-4000:]  # what the ranks said, should it fail (it failed once, 2026-12-07)
    ranks = [json.loads(open(f"{out}.rank{r}.json").read()) for r in (0, 1)]
    assert ranks[1]["raised"] and not ranks[0]["raised"]
    assert [len(r["fallbacks"]) for r in ranks] == [1, 1] and [r["micro_batch"] for r in ranks] == [2, 2]
    sgd = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="sgd", lr=0.1)
    workload = build_workload(sgd, "cpu", seed=0)
    train(workload, make_plan(16, 16), SyntheticCorpus(16, seed=0), TrainConfig(steps=2, seed=0))
    ddp = load_file(out)
    for name, value in workload.model.state_dict().items():
        assert_close_at_scale(ddp[name], value, msg=name)


@pytest.mark.slow
@pytest.mark.distributed
def test_an_oom_in_the_backward_ddp_synchronizes_stops_with_one_line_not_a_collective_mismatch(tmp_path):
    """Rank 1 runs out of memory in the last micro-step's backward, where rank 0 waits in DDP's all-reduce: no vote
    reaches it. Before, rank 1 redid the step and its vote met rank 0's gradient bucket (gloo: "Received data size
    doesn't match expected size", SIGABRT); now it stops and says how to launch for a restart."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT, free_port

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    done = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                           os.path.join(REPO_ROOT, "tests", "scripts", "ddp_oom.py"), str(tmp_path / "w"), "backward"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT))
    assert done.returncode != 0
    assert ("rank 1 ran out of memory at step 1, in the backward of micro-step 2 of 2, at micro-batch 4 under DDP, "
            "where the other ranks wait inside its gradient all-reduce" in done.stderr), done.stderr[-4000:]
    assert "--max-restarts 1" in done.stderr and "collective mismatch" not in done.stderr


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_an_oom_in_the_backward_ddp_synchronizes_is_redone_at_half_through_a_torchrun_restart(tmp_path):
    """With --max-restarts 1 rank 1 leaves micro-batch 4 for the restarted ranks, which train both steps at 4: the
    weights equal a run at 4 from the start."""
    from safetensors.torch import load_file

    from tests.cli.test_train_fsdp import torchrun
    from tests.conftest import free_port

    common = ["train", "--model", "tests.scripts.backward_oom_model:make_model", "--device", "cpu",
              "--effective-batch", "16", "--steps", "2", "--optimizer", "sgd", "--threads", "1", "--json"]
    restarted = torchrun(*common, "--micro-batch", "8", "--out", str(tmp_path / "restarted"),
                         "--save-weights", str(tmp_path / "restarted.st"), port=free_port(), restarts=1)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "restarted by torchrun" in restarted.stderr, restarted.stderr[-3000:]
    summary = json.loads(restarted.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["plan"]["micro_batch"] == 4, summary["plan"]
    assert summary["oom_fallbacks"] == ["step 1: rank 1 ran out of memory at step 1, in the backward of micro-step 1 "
                                        "of 1, at micro-batch 8 under DDP; redone with micro-batch 4 x 2 "
                                        "accumulation steps after torchrun's restart"]
    direct = torchrun(*common, "--micro-batch", "4", "--out", str(tmp_path / "direct"),
                      "--save-weights", str(tmp_path / "direct.st"), port=free_port())
    assert direct.returncode == 0, direct.stderr[-3000:]
    a, b = load_file(tmp_path / "restarted.st"), load_file(tmp_path / "direct.st")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "the restarted run trained other weights"


def test_a_steps_inputs_are_released_before_the_next_step_runs():
    """The loop held a step's micro-batches through the next step: a module:function workload's float inputs were
    two steps' worth under the budget where the probe's trial holds one's, and a run at the probed B* (159, 256 MiB,
    an MLP over (B, 64, 256) inputs) ran out of memory at step 2 until 140 (sweep 19); now it trains at 159."""
    import weakref

    workload = build_workload(WorkloadSpec(model="tests.training.linear_regression:make", optimizer="sgd", lr=1e-3),
                              "cpu", seed=0)
    made, held = [], []
    inner_make, inner_loss = workload.make_batch, workload.raw_loss

    def make_batch(size):
        batch = inner_make(size)
        made.append(weakref.ref(batch["x"]))  # a micro-batch is a slice of it: it lives while any slice does
        return batch

    def raw_loss(model, batch):
        held.append(sum(ref() is not None for ref in made[:-1]))  # earlier calls' inputs still alive
        return inner_loss(model, batch)

    workload.make_batch, workload.raw_loss = make_batch, raw_loss
    train(workload, make_plan(8, 4), None, TrainConfig(steps=3, seed=0, noise_scale=False))
    assert len(made) >= 3 and held[-4:] == [0, 0, 0, 0], held


def test_what_a_python_caller_may_pass_wrong_is_one_line():
    """A WorkloadSpec is not a built workload; a plan or config of another kind; an empty corpus (an IndexError)."""
    from gaplan import GaplanError, WorkloadSpec

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16)
    workload = build_workload(spec, "cpu", seed=0)
    for arguments, message in (((spec, make_plan(8, 4), None, TrainConfig(steps=1)), "train takes a built workload"),
                               ((workload, "plan.json", None, TrainConfig(steps=1)), "train takes a gaplan Plan"),
                               ((workload, make_plan(8, 4), [], TrainConfig(steps=1)), "train's corpus is empty")):
        with pytest.raises(GaplanError, match=message):
            train(*arguments)
