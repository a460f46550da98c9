"""FSDP2 workloads built on meta, sharded, then filled from rank 0: every rank gets rank 0's whole-model weights
(and the buffers no state dict holds), and a rank other than 0 never holds the whole model."""

import json
import os

import pytest
import torch.multiprocessing as mp

from tests.model_folders import _make_folder, llama_config

# 8 layers of 256: the blocks dominate (25 MiB of 27 MiB), so half the model is far below the whole.
WIDE_LLAMA = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=4)


def _rank_main(rank: int, store_path: str, folder: str, out: str) -> None:
    import sys

    import torch
    import torch.distributed as dist

    from gaplan.devices.backend import make_backend
    from gaplan.workload.build import load_model_code
    from gaplan.workload.spec import WorkloadSpec

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    spec = WorkloadSpec(model=folder, seq_len=16, parallel="fsdp")
    load_model_code(spec)  # the libraries' one-time memory, before the peak is measured (as the probe's worker)
    meter = make_backend("cpu")
    meter.activate(None, enforce=False)
    meter.reset_peak()
    before = set(sys.modules)
    from gaplan.parallel.build import build_sharded_workload

    build = build_sharded_workload(spec, "cpu", seed=3)
    peak = meter.peak_bytes()
    # Library code a trial imports after its baseline reads as training memory (transformers 5.25 stopped
    # importing torch's distributed checkpoint: 70-odd modules, 2.4 MiB in every FSDP trial's peak).
    late_imports = sorted(name for name in set(sys.modules) - before if name.startswith("torch"))
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = build.workload.model
    # Gathered on every rank (no CPU offload: that keeps it on rank 0 only), so each rank's shards are checked.
    state = {k: v.clone() for k, v in get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)).items()}
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    torch.save({"state": state, "buffers": buffers}, os.path.join(out, f"rank{rank}.pt"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as file:
        json.dump({"build_peak": peak, "blocks": build.block_count, "weights": build.workload.info["weights"],
                   "late_imports": late_imports}, file)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
# The pretrained variant (a folder read by every rank, 14 s) runs in -m heavy: the default run stays under 10 minutes.
@pytest.mark.parametrize("with_weights", [False, pytest.param(True, marks=pytest.mark.heavy)],
                         ids=["random-init", "pretrained"])
def test_every_rank_gets_rank_zeros_weights_and_no_other_rank_holds_the_whole_model(tmp_path, with_weights):
    import torch

    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import WorkloadSpec

    folder = _make_folder(str(tmp_path / "model"), lambda vocab: llama_config(vocab, **WIDE_LLAMA), with_weights,
                          with_tokenizer=False, sharded=False, seed=7, vocab_size=500)
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(_rank_main, args=(str(tmp_path / "store"), folder, str(out)), nprocs=2, start_method="spawn")

    whole = build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu", seed=3).model
    expected_state, expected_buffers = whole.state_dict(), dict(whole.named_buffers())
    whole_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    for rank in (0, 1):
        got = torch.load(out / f"rank{rank}.pt")
        assert got["state"].keys() == expected_state.keys()
        assert all(torch.equal(got["state"][k], expected_state[k]) for k in expected_state), "weights differ"
        assert got["buffers"].keys() == expected_buffers.keys() and any("inv_freq" in k for k in expected_buffers)
        assert all(torch.equal(got["buffers"][k], expected_buffers[k]) for k in expected_buffers), "buffers differ"
        report = json.loads((out / f"rank{rank}.json").read_text())
        assert report["blocks"] == 8 and report["weights"] == ("pretrained" if with_weights else "random")
        assert report["late_imports"] == [], report["late_imports"]
    # Rank 1 holds its half and one whole tensor in flight: 14.7 MiB measured. Building the whole model and then
    # sharding it (before) peaked at 38.8 MiB. Rank 0 builds the whole model on the CPU by design: it is the source.
    rank1_peak = json.loads((out / "rank1.json").read_text())["build_peak"]
    assert rank1_peak < 0.75 * whole_bytes, (rank1_peak, whole_bytes)
