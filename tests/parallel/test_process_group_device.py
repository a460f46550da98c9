"""Under torchrun, joining the process group binds no CUDA device: no context on the card before the probe.

``torch.cuda.set_device`` creates the primary context. Called when the group is formed, it would hold hundreds of
MiB on the card of the node's first process while that process probes, beside each trial's own context, and the
probe's B* would be measured with one context more than training has (issue 45, item 4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gaplan.devices.cuda import CudaBackend
from gaplan.parallel.process_group import init_distributed, local_device
from tests.devices.test_cuda_tripwire import DriverTripwire


def test_joining_the_group_under_torchrun_touches_no_cuda_device(monkeypatch):
    tripwire = DriverTripwire(monkeypatch)
    joined: list[str] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: joined.append(backend))
    init_distributed("cuda")
    assert joined == ["cpu:gloo,cuda:nccl"]
    assert tripwire.calls == []  # before this change: ['set_device'], on the probing rank's card


def test_the_memory_meter_binds_the_ranks_own_device_later(monkeypatch):
    bound: list[torch.device] = []
    properties = type("Properties", (), {"total_memory": 80 * 2**30})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    meter = CudaBackend(local_device("cuda"))
    meter.activate(None)
    assert bound == [torch.device("cuda:1")] and meter.limit_bytes == 80 * 2**30
