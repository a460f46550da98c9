"""The GPU check's own import path starts no CUDA driver (no GPU here: a tripwire stands in for the driver).

``bash tests/gpu/gpu_check.sh`` runs ``pytest -m gpu tests/gpu`` in one process, and that process is a caller of
gaplan like any user's: its checks resolve ``cuda`` by forking a child that asks the card. A driver started while
pytest imports the harness (``torch.cuda.is_available()`` in a ``skipif``, as the harness had it) makes that child
fail, and the checks with it, for a reason that is not the product's.

Here, in a fresh interpreter, every torch function that starts the driver (the same list as
``tests/devices/test_cuda_tripwire.py``, plus ``torch.cuda._lazy_init`` and the build's ``_cuda_getDeviceCount``)
is replaced by a recorder that answers as one card would, torch is made to look like a CUDA build, and pytest
collects ``tests/gpu`` with ``-m gpu`` as the script does. The recorders run in the forked child that asks the card
too, but what a child records stays in the child: the list printed is the collecting process's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ..conftest import REPO_ROOT

COLLECT = r"""
import json, sys

import torch

calls = []


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
    setattr(torch.cuda, name, recorder(name, answers.get(name)))
torch._C._cuda_getDeviceCount = recorder("_cuda_getDeviceCount", 1)  # a CUDA build has it (torch.cuda._is_compiled)
torch.version.cuda = "12.8"
torch.backends.cuda.is_built = lambda: True

import pytest

code = pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/gpu"])
cards = getattr(sys.modules["tests.gpu.test_gpu"], "CARDS", None)
print("RESULT " + json.dumps({"calls": calls, "exit": int(code), "cards": cards and cards.names}))
"""


def test_importing_the_gpu_harness_starts_no_driver():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # torch's default: is_available() would call the driver
    done = subprocess.run([sys.executable, "-c", COLLECT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["exit"] == 0, done.stdout[-2000:]  # the checks were collected
    assert result["calls"] == [], f"the harness's import path called the driver: {result['calls']}"
    assert result["cards"] == ["stand-in card"]  # the card was asked, in a child, and its answer came back
