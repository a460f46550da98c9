"""NCCL's buffers in the estimate: above one rank on CUDA they are added to every peak and stated (issue 45)."""

from __future__ import annotations

import pytest

from gaplan.devices.reserve import nccl_buffer_bytes
from gaplan.estimate.assumptions import nccl_buffers
from gaplan.estimate.trace import Tracer
from gaplan.workload.spec import WorkloadSpec

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=8)


@pytest.fixture(autouse=True)
def nccls_defaults(monkeypatch):
    for name in ("NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS"):
        monkeypatch.delenv(name, raising=False)


def test_only_ranks_on_cuda_hold_nccls_buffers_and_the_line_says_whence():
    assert Tracer(SPEC, "cuda", threads=1, world_size=2).nccl_bytes == nccl_buffer_bytes(2) == 256 * 2**20
    assert Tracer(SPEC, "cuda", threads=1).nccl_bytes == 0  # one process: no NCCL
    assert Tracer(SPEC, "cpu", threads=1, world_size=2).nccl_bytes == 0  # ranks on CPU talk through gloo
    note = nccl_buffers(256 * 2**20, 2)
    assert note.topic == "outside-pytorch" and note.values["nccl_bytes"] == 256 * 2**20
    assert "NCCL_BUFFSIZE, 4 MiB by default per NCCL's documentation" in note.text and "256.00 MiB" in note.text


@pytest.mark.heavy  # a fake workload is built: ~4 s
def test_ranks_on_cuda_add_nccls_buffers_to_the_peak_and_say_so():
    with Tracer(SPEC, "cuda", threads=1, world_size=2) as ranks:
        assert ranks.overhead() == ranks.bucket_bytes + ranks.nccl_bytes  # in every row's peak_bytes
        notes = [a for a in ranks.assumptions() if a.values.get("nccl_bytes")]
        assert notes == [nccl_buffers(ranks.nccl_bytes, 2)]
        assert ranks.extra()["nccl_bytes"] == 256 * 2**20
