"""NCCL's buffers in the estimate: above one rank on CUDA they are added to every peak and stated (issue 45)."""

from __future__ import annotations

from gaplan.devices.reserve import nccl_buffer_bytes
from gaplan.estimate.trace import Tracer
from gaplan.workload.spec import WorkloadSpec


def test_ranks_on_cuda_add_nccls_buffers_to_the_peak_and_say_so(monkeypatch):
    for name in ("NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS"):
        monkeypatch.delenv(name, raising=False)
    spec = WorkloadSpec(model="tiny-gpt2", seq_len=8)
    with Tracer(spec, "cuda", threads=1, world_size=2) as ranks:
        assert ranks.nccl_bytes == nccl_buffer_bytes(2) == 256 * 2**20
        assert ranks.overhead() == ranks.bucket_bytes + ranks.nccl_bytes  # in every row's peak_bytes
        notes = [a for a in ranks.assumptions() if a.values.get("nccl_bytes")]
        assert len(notes) == 1 and notes[0].topic == "outside-pytorch" and "NCCL_BUFFSIZE" in notes[0].text
        assert ranks.extra()["nccl_bytes"] == 256 * 2**20
    # unentered (nothing traced): one process has no NCCL, and ranks on CPU talk through gloo
    assert Tracer(spec, "cuda", threads=1).nccl_bytes == 0
    assert Tracer(spec, "cpu", threads=1, world_size=2).nccl_bytes == 0
