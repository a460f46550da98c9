"""``tests/gpu/gpu_check.sh`` on a machine without CUDA: it fails loudly, in one line, and writes no table."""

from __future__ import annotations

import os
import subprocess

import pytest

from gaplan.devices.card import cuda_cards

from ..conftest import REPO_ROOT


# The cards asked in a child, as in test_gpu.py: this module is on the GPU check's import path too.
@pytest.mark.skipif(cuda_cards().count > 0, reason="this machine has CUDA: the script runs its checks here")
def test_without_cuda_the_check_refuses_in_one_line(tmp_path):
    table = tmp_path / "table.md"
    done = subprocess.run(["bash", os.path.join(REPO_ROOT, "tests", "gpu", "gpu_check.sh"), str(table)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "no CUDA device here" in done.stderr
    assert done.stdout == "" and not table.exists()
