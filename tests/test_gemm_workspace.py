"""MKL's cached GEMM workspace is released around every micro-step, so a micro-step's memory does not depend on the
shapes run before it (issue 13: it grew with changing shapes and a training run ran out of memory at T*)."""

import pytest
import torch
from torch import nn

from gaplan.gemm_workspace import gemm_workspace_bytes, release_gemm_workspace
from gaplan.loss import CLASSIFICATION
from gaplan.step import accumulate_gradients

pytestmark = pytest.mark.skipif(gemm_workspace_bytes() is None, reason="torch is not built with MKL here")


def test_a_large_product_leaves_workspace_in_mkls_pool_and_releasing_it_empties_the_pool():
    release_gemm_workspace()
    x, w = torch.randn(384, 256), torch.randn(8192, 256)
    (x @ w.t()).sum()
    assert gemm_workspace_bytes() > 1 << 20  # what the fix is about: MKL keeps it after the product
    release_gemm_workspace()
    assert gemm_workspace_bytes() == 0


def test_an_accumulated_step_leaves_no_workspace_behind_whatever_its_shapes():
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
        # Empty at each micro-step, whatever the micro-step before it multiplied, and after the step.
        assert workspace == [0, 0] and gemm_workspace_bytes() == 0, workspace
