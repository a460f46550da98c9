"""A two-rank NCCL trial on two cards: NCCL's buffers against the estimate's allowance, and the DDP step's reserved
peak against the estimate's (issue 45, item 4). The lent machines have one card: there the row says
"skipped: needs 2 GPUs" and fails nothing. The cards are asked in a forked child (``cuda_cards``), never here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gaplan.devices.card import cuda_cards

from ..conftest import REPO_ROOT

CARDS = cuda_cards()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CARDS.count, reason="needs a CUDA device")]
MICRO_BATCH = 4
NEEDS_TWO = "needs 2 GPUs"


def test_a_two_rank_nccl_trials_peak_and_nccls_buffers(record_property):
    if CARDS.count < 2:
        print(f"skipped: {NEEDS_TWO} ({CARDS.count} here)")
        pytest.skip(NEEDS_TWO)
    from gaplan.devices.reserve import nccl_buffer_bytes
    from gaplan.estimate import trace_steps
    from gaplan.workload.spec import WorkloadSpec

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           os.path.join(REPO_ROOT, "tests", "gpu", "nccl_ranks.py"), str(MICRO_BATCH)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    allowance = nccl_buffer_bytes(2)
    (row,) = trace_steps(WorkloadSpec(model="tiny-gpt2", seq_len=256), [MICRO_BATCH], device_kind="cuda", world_size=2)
    predicted = row.peak_bytes - allowance  # the estimate's peak less NCCL's, which max_memory_reserved never holds
    nccl, peak = max(seen["nccl_bytes"]), max(seen["peak_bytes"])
    record_property("measured", f"2 ranks, NCCL: {nccl / 2**20:.0f} MiB outside the allocator after the first "
                                f"all_reduce (allowance {allowance / 2**20:.0f} MiB); DDP tiny-gpt2 seq 256 x "
                                f"{MICRO_BATCH}: reserved peak {peak / 2**20:.1f} MiB, estimate {predicted / 2**20:.1f} "
                                f"MiB ({(predicted - peak) / peak:+.1%})")
    assert nccl > 0 and peak > 0
