"""``gaplan probe --lora`` on CUDA: the estimate that seeds the search imports no bitsandbytes in the probing process.

The seed is traced in ``gaplan probe``'s (and ``gaplan train``'s) own process, and a LoRA model's build imports peft,
which imports bitsandbytes, whose import asks the card for its compute capability: torch's CUDA is then initialized
in a process that later forks children (the card's questions, :func:`gaplan.devices.card.cuda_cards`). With a card
(here a tripwire: torch's driver functions replaced by recorders that answer as one card would), the seed is traced
in a forked child instead, and this process records no call; the same import done here afterwards records them, so
the test can fail. In a fresh interpreter: an import done by an earlier test would record nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = r"""
import json, os, sys

import torch

calls, originals = [], {}


def recorder(name, answer):
    def call(*args, **kwargs):
        calls.append(name)
        return answer

    return call


properties = type("Properties", (), {"name": "stand-in card", "total_memory": 80 * 2**30, "major": 9, "minor": 0})
answers = {"is_available": True, "device_count": 1, "get_device_properties": properties,
           "mem_get_info": (79 * 2**30, 80 * 2**30), "current_device": 0, "get_device_name": "stand-in card",
           "get_device_capability": (9, 0), "is_bf16_supported": True}
for name in ("is_available", "device_count", "get_device_properties", "mem_get_info", "current_device", "set_device",
             "init", "get_device_name", "get_device_capability", "is_bf16_supported", "synchronize", "_lazy_init"):
    originals[name] = getattr(torch.cuda, name)
    setattr(torch.cuda, name, recorder(name, answers.get(name)))
real_fork = os.fork


def fork():
    pid = real_fork()
    if pid == 0:  # the child is not under test: it gets this CPU machine's own torch.cuda back
        for name, function in originals.items():
            setattr(torch.cuda, name, function)
    return pid


os.fork = fork
from gaplan.devices import card

card._asked = card.CudaCards(("stand-in card",), (80 * 2**30,), (79 * 2**30,), "12.8")
from gaplan.workflows.probe import estimate_start
from gaplan.workload.spec import WorkloadSpec

said = []
start = estimate_start(WorkloadSpec(model="tiny-gpt2", seq_len=8, lora=True), "cuda", 2**30, 0.0, 2, 1, said.append)
parent = list(calls)
loaded = "bitsandbytes" in sys.modules or "peft" in sys.modules
try:
    import peft  # noqa: F401  the control
except AttributeError:  # bitsandbytes, told a card is there, reaches for torch's CUDA ops: this build has none
    pass
print("RESULT " + json.dumps({"calls": parent, "start": start, "said": said, "loaded": loaded,
                              "control": calls[len(parent):]}))
"""


@pytest.mark.heavy  # a fresh interpreter that imports peft twice over and traces: ~30 s on 2 shared cores
def test_the_lora_seed_estimate_on_cuda_imports_bitsandbytes_only_in_a_child():
    pytest.importorskip("bitsandbytes")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["calls"] == [] and not result["loaded"]  # neither peft nor bitsandbytes was imported here
    assert result["start"] == 2 and "starting the search there" in result["said"][0]  # traced, in the child
    assert "get_device_capability" in result["control"]  # the import, done here, initializes CUDA
