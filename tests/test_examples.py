"""The examples run as written (each as its own process, as a user would) and print their key lines."""

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name, *args):
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "examples", name), *args], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.heavy
@pytest.mark.slow
def test_plain_pytorch_example():
    out = run_example("plain_pytorch.py")
    assert "plan: 24 samples per step as micro-batches 5,5,5,5,4" in out
    exact = next(line for line in out.splitlines() if line.startswith("accumulated vs one-batch gradient"))
    assert float(exact.split("max difference ")[1].split()[0]) < 1e-6, exact
    assert "step 8: loss" in out and "final loss:" in out


@pytest.mark.heavy
@pytest.mark.slow
def test_hf_trainer_example():
    pytest.importorskip("accelerate")  # transformers.Trainer needs it
    out = run_example("hf_trainer.py", "--max-micro-batch", "5")
    assert "note: gaplan's plan splits 24 samples per device as 5,5,5,5,4" in out
    assert "Trainer: 4 per device x 6 accumulation steps x 1 device(s)" in out
    assert "per_device_train_batch_size=4," in out
    assert "step 5: loss" in out and "final loss:" in out


def run_script(name, *args):
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    result = subprocess.run(["bash", os.path.join(REPO_ROOT, "examples", name), *args], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_torchrun_example(tmp_path):
    import json

    out = run_script("ddp_torchrun.sh", str(tmp_path))
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert summary["steps"] == 3 and summary["plan"]["world_size"] == 2 and summary["plan"]["grad_accum_steps"] == 2


@pytest.mark.heavy
@pytest.mark.slow
def test_plan_for_h100_example():
    out = run_script("plan_for_h100.sh", "h100-80gb", "256")  # a short sequence keeps the trace quick
    assert "largest micro-batch predicted to fit:" in out
    assert "does not fit in 79.08 GiB" in out  # AdamW's 16 bytes per parameter alone exceed the card
