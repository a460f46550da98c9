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

from tests.cuda_standin import run_with_standin

COLLECT = r"""
import json, sys

torch._C._cuda_getDeviceCount = recorder("_cuda_getDeviceCount", 1)  # a CUDA build has it (torch.cuda._is_compiled)
torch.version.cuda = "12.8"
torch.backends.cuda.is_built = lambda: True

import pytest

code = pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/gpu"])
cards = getattr(sys.modules["tests.gpu.test_gpu"], "CARDS", None)
print("RESULT " + json.dumps({"calls": calls, "exit": int(code), "cards": cards and cards.names}))
"""


def test_importing_the_gpu_harness_starts_no_driver():
    result, done = run_with_standin(COLLECT, timeout=120)
    assert result["exit"] == 0, done.stdout[-2000:]  # the checks were collected
    assert result["calls"] == [], f"the harness's import path called the driver: {result['calls']}"
    assert result["cards"] == ["stand-in card"]  # the card was asked, in a child, and its answer came back
