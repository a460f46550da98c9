"""A stand-in for torch's CUDA driver, for scripts run in a fresh interpreter: each torch function that starts the
driver is replaced by a recorder that answers as one 80 GiB card would, and records its name in ``calls``
(``originals`` keeps the real ones). Glue-code tests only: no CUDA claim rests on it.

:func:`run_with_standin` runs a script body after the stand-in and returns what the body printed after ``RESULT ``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT

STANDIN = r"""
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
"""


def run_with_standin(body: str, timeout: int) -> tuple[dict, subprocess.CompletedProcess]:
    """Run :data:`STANDIN` then ``body`` in a fresh interpreter at the repository's root; the JSON it printed after
    ``RESULT `` (the last such line), and the finished process for messages."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # torch's default: is_available() would call the driver
    done = subprocess.run([sys.executable, "-c", STANDIN + body], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("RESULT ")), done
