"""MKL's GEMM workspace: off where gaplan loads before torch; released around every micro-step where it is on.

Its pool grew with changing shapes (a training run ran out of memory at T*, issue 13) and its buffers' alignment
made a CPU edge differ by a sample from process to process. Each case runs in a fresh interpreter: MKL reads
``MKL_DISABLE_FAST_MM`` when torch loads it, so which of torch and gaplan is imported first decides.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from gaplan.devices.mkl import gemm_workspace_bytes

pytestmark = pytest.mark.skipif(gemm_workspace_bytes() is None, reason="torch is not built with MKL here")

TORCH_FIRST = "import torch\nimport gaplan  # too late to turn MKL's pool off: it is on, as in a user's script\n"
GAPLAN_FIRST = "import gaplan  # sets MKL_DISABLE_FAST_MM before torch loads MKL\nimport torch\n"


def run(prelude: str, body: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MKL_DISABLE_FAST_MM"}
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


BUDGET = "import warnings\nwarnings.simplefilter('ignore')\ngaplan.cpu_budget('8GiB')  # releases apply under a budget\n"
PRODUCT = """
from gaplan.devices.mkl import gemm_workspace_bytes, release_gemm_workspace
x, w = torch.randn(384, 256), torch.randn(8192, 256)
(x @ w.t()).sum()
held = gemm_workspace_bytes()
release_gemm_workspace()
print(held, gemm_workspace_bytes())
"""


def test_with_gaplan_loaded_first_mkl_keeps_no_workspace_pool():
    held, after = map(int, run(GAPLAN_FIRST, PRODUCT).split())
    assert held == 0 and after == 0


def test_where_the_pool_is_on_a_product_leaves_workspace_and_releasing_it_empties_the_pool():
    held, after = map(int, run(TORCH_FIRST + BUDGET, PRODUCT).split())
    assert held > 1 << 20  # what the release is for: MKL keeps it after the product
    assert after == 0


def test_without_a_budget_the_pool_is_kept_for_reuse():
    """Plain training binds nothing: releasing would only make every GEMM map its buffers afresh."""
    held, after = map(int, run(TORCH_FIRST, PRODUCT).split())
    assert held > 1 << 20 and after == held


def test_where_the_pool_is_on_an_accumulated_step_leaves_no_workspace_behind_whatever_its_shapes():
    out = run(TORCH_FIRST + BUDGET, """
        from torch import nn
        from gaplan.devices.mkl import gemm_workspace_bytes
        from gaplan.core.tasks import CLASSIFICATION
        from gaplan.training.step import accumulate_gradients

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 8192), nn.Linear(8192, 4))
        workspace = []

        def raw_loss(module, batch):
            workspace.append(gemm_workspace_bytes())  # at the start of the micro-step's forward
            return nn.functional.cross_entropy(module(batch["x"]), batch["labels"], reduction="sum")

        for rows in ((384, 16), (16, 384), (200, 200)):
            batches = [{"x": torch.randn(n, 256), "labels": torch.randint(0, 4, (n,))} for n in rows]
            workspace.clear()
            accumulate_gradients(model, batches, raw_loss, CLASSIFICATION)
            print(workspace, gemm_workspace_bytes())
        """)
    for line in out.splitlines():  # empty at each micro-step, whatever the one before multiplied, and after
        assert line == "[0, 0] 0", out
