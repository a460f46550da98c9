"""A ``--memory-limit`` on CUDA is the card's memory: the worker caps the allocator at it less the allowances."""

from __future__ import annotations

import os

import pytest

from gaplan.core.constants import MiB
from gaplan.devices.reserve import CONTEXT_BYTES, nccl_buffer_bytes
from gaplan.worker.protocol import WorkerSetup
from tests.devices.test_cuda_tripwire import DriverTripwire

GiB = 2**30


def test_the_allocators_budget_loses_the_context_and_nccls_buffers_on_cuda_only(monkeypatch):
    for name in ("NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS"):
        monkeypatch.delenv(name, raising=False)
    card = WorkerSetup({}, "cuda:0", 8 * GiB, card_limit=True)
    assert card.allocator_limit("cuda:0") == 8 * GiB - CONTEXT_BYTES
    assert card.allocator_limit("cpu") == 8 * GiB  # a CPU budget has no context to leave out
    ddp = WorkerSetup({}, "cuda:0", 8 * GiB, ddp=True, card_limit=True)
    assert ddp.allocator_limit("cuda:0") == 8 * GiB - CONTEXT_BYTES - nccl_buffer_bytes(2) == 8 * GiB - 768 * MiB
    ranks = WorkerSetup({}, "cuda", 8 * GiB, ranks=2, card_limit=True)
    assert ranks.allocator_limit("cuda:1") == ddp.allocator_limit("cuda:0")
    # the default budget (the whole card, or its --margin) is the physical card: its context is already off it
    assert WorkerSetup({}, "cuda:0", 8 * GiB).allocator_limit("cuda:0") == 8 * GiB
    assert WorkerSetup({}, "cuda:0", None, card_limit=True).allocator_limit("cuda:0") is None
    assert WorkerSetup.from_dict(card.to_dict()) == card  # it travels to the worker


@pytest.mark.parametrize("limit", [None, 8 * GiB])
def test_gaplan_probe_says_when_its_budget_is_a_given_cards_memory(monkeypatch, limit):
    DriverTripwire(monkeypatch)
    import gaplan.probing.edge as probing
    from gaplan.workload.spec import WorkloadSpec

    seen = {}

    class WorkerStandIn:  # records what the worker would get, then stops the probe
        def __init__(self, spec, device, limit_bytes, **options):
            seen.update(limit=limit_bytes, card_limit=options.get("card_limit"))
            raise KeyboardInterrupt

    monkeypatch.setattr(probing, "WorkerProcess", WorkerStandIn)
    with pytest.raises(KeyboardInterrupt):
        probing.probe(WorkloadSpec(seq_len=16), device="cuda", memory_limit=limit)
    assert seen == {"limit": limit or 80 * GiB, "card_limit": limit is not None}
    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"


def test_target_on_a_larger_card_is_that_cards_memory(monkeypatch):
    """``gaplan probe --target t4`` gives the T4's memory as a card's: the worker takes the context's allowance off
    it (not a second time: the target's own usable bytes have it off already), the workspaces stay in the allocator."""
    DriverTripwire(monkeypatch)
    from gaplan.estimate import lookup_target
    from gaplan.workflows.parse_options import target_budget

    t4 = lookup_target("t4")
    limit = target_budget("t4", None, "cuda")
    assert limit == t4.total_bytes
    assert WorkerSetup({}, "cuda:0", limit, card_limit=True).allocator_limit("cuda:0") == t4.usable_bytes + t4.workspace_bytes
