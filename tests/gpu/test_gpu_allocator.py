"""On one CUDA device: gaplan's replay of the caching allocator (gaplan.estimate.allocator) reserves what torch's own
does, step by step, over random sequences of allocations and frees (each in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gaplan.devices.card import cuda_cards

from ..conftest import REPO_ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_cards().count, reason="needs a CUDA device")]


def test_the_allocator_replay_reserves_what_torch_reserves(record_property):
    results = []
    path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    for seed in range(5):
        done = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tests", "gpu", "allocator_replay.py"),
                               str(seed), "400"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "", "PYTHONPATH": path})
        assert done.returncode == 0, done.stderr[-2000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    differing = sum(r["differing_steps"] for r in results)
    record_property("measured", f"5 random sequences x 400 steps: {differing} steps where the replay's reserved bytes "
                                f"differ from torch.cuda.memory_reserved (first: {[r['differ'][:1] for r in results]})")
    assert differing == 0, results
