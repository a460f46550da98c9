"""docs/estimate-vs-published.md stays true to its data: the table is what the results file renders to, every
published row names its source and its kind, and the median and worst error the page states are the file's."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "estimate-vs-published.md"
ROWS = json.loads((ROOT / "docs" / "data" / "published_gpu.json").read_text())
RESULTS = json.loads((ROOT / "docs" / "data" / "published_gpu_results.json").read_text())
BLOCK = re.compile(r"<!-- generated: docs/data/published_gpu_results.json -->\n(.*?)\n<!-- end generated -->", re.S)


def _script():
    spec = importlib.util.spec_from_file_location("published_gpu_check", ROOT / "examples" / "published_gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_table_is_what_the_results_file_renders_to():
    (block,) = BLOCK.findall(PAGE.read_text())
    assert block == _script().render_table(RESULTS)


def test_every_row_names_its_source_and_what_it_measured():
    assert len(ROWS) >= 20
    assert len({r["id"] for r in ROWS}) == len(ROWS)
    for row in ROWS:
        source = row["source"]
        assert re.fullmatch(r"[0-9a-f]{40}", source.get("commit", "")) or source.get("url", "").startswith("https://")
        assert row["kind"] in ("allocated", "reserved", "nvidia-smi")
        assert row["quote"] and str(row["published"]["value"]).rstrip("0").rstrip(".") in row["quote"]
        assert row["expressible"] or row["why_not"]
        assert (ROOT / row["config"] / "config.json").is_file()


def test_the_results_cover_every_row_once():
    ids = [r["id"] for r in RESULTS["rows"]] + [r["id"] for r in RESULTS["not_expressible"]]
    assert sorted(ids) == sorted(r["id"] for r in ROWS)


def test_the_median_and_worst_error_the_page_states_are_the_results_files():
    text = PAGE.read_text()
    stated = _script().summary(RESULTS)
    assert stated == RESULTS["summary"]
    assert f"median absolute error is {stated['median_abs_error_pct']}%" in text
    assert f"`{stated['worst_id']}`, {stated['worst_error_pct']:+.1f}%" in text
    assert f"{stated['within_5_pct']} of {stated['rows']} expressible rows" in text


def test_the_bert_rows_figures_the_page_states_are_the_results_files():
    """The five BERT rows traced through torch 1.10's softmax: their errors and the gap a sample between micro-batch
    4 and 1, published and estimated, as the page says them."""
    text = " ".join(PAGE.read_text().split())
    rows = {r["id"]: r for r in RESULTS["rows"]}
    ids = ["hf-bert-vanilla", "hf-bert-accum", "hf-bert-fp16", "hf-bert-adafactor", "hf-bert-adam8bit"]
    assert all(next(r for r in ROWS if r["id"] == i)["settings"]["torch"] == "1.10" for i in ids)
    errors = [f"{rows[i]['error_pct']:.1f}%" for i in ids]
    assert f"The five rows now read {', '.join(errors[:-1])} and {errors[-1]}" in text
    gib = 1024**3
    four, one = rows["hf-bert-vanilla"], rows["hf-bert-accum"]
    estimated = (four["estimated_bytes"] - one["estimated_bytes"]) / 3 / gib
    published = (four["published_bytes"] - one["published_bytes"]) / 3 / gib
    assert f"{estimated:.2f} GiB a sample against the published {published:.2f}" in text
    # The fp16 row with the fp16 scores kept (2 bytes, not the float32 copy's 4): 24 layers x 4 samples x 16 heads.
    fp16 = rows["hf-bert-fp16"]
    halved = fp16["estimated_bytes"] - 24 * 4 * 16 * 512 * 512 * 2
    error = 100 * (halved - fp16["published_bytes"]) / fp16["published_bytes"]
    assert f"kept at 2 bytes it would read about {error:.1f}%" in text


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("row_id", ["hf-bert-gc-fp16-adam8bit", "hf-bert-accum"])
def test_a_row_estimates_as_recorded(row_id):
    """BERT-large rows re-traced (about 10 s each on 2 cores), one through torch 1.10's softmax: the trace is the
    same on every machine."""
    recorded = next(r for r in RESULTS["rows"] if r["id"] == row_id)
    row = next(r for r in ROWS if r["id"] == recorded["id"])
    assert _script().estimate_row(row)["estimated_bytes"] == recorded["estimated_bytes"]


@pytest.mark.parametrize(("dtype", "checkpointing"), [("fp32", "off"), ("fp16", "on")])
def test_a_row_on_torch_1_10_keeps_each_softmax_input_as_that_torch_did(dtype, checkpointing):
    """torch 1.10's softmax node kept its input until its backward: one [micro-batch, heads, seq, seq] tensor a
    block more at the backward's peak (the preset tiny-bert-cls), and with checkpointing only the block being
    recomputed keeps it. Under fp16 autocast the trace keeps the device model's float32 copy (the BERT rows' run had
    float32 scores: the page)."""
    from gaplan.core.checkpointing import parse_checkpointing
    from gaplan.estimate import trace_steps
    from gaplan.workload.spec import WorkloadSpec

    script = _script()
    spec = WorkloadSpec(model="tiny-bert-cls", seq_len=512, dtype=dtype, weights_dtype="fp32",  # 4 blocks, 4 heads
                        optimizer="adamw-forloop", attention="eager", grad_checkpointing=parse_checkpointing(checkpointing))
    peaks = {}
    for torch_version in (None, "1.10"):
        with script.older_autograd(torch_version):
            (row,) = trace_steps(spec, [4], device_kind="cuda")
        peaks[torch_version] = row.activations
    scores = 4 * 4 * 512 * 512 * 4  # micro-batch x heads x seq x seq, float32
    assert peaks["1.10"] - peaks[None] == scores * (4 if checkpointing == "off" else 1)


@pytest.mark.parametrize("checkpointing", ["off", "on"])
def test_a_row_on_torch_2_1_keeps_each_means_input_as_that_torch_did(checkpointing):
    """torch 2.1's mean node kept its input until its backward: transformers' Llama RMSNorm takes the mean of the
    float32 squares, so each of tiny-llama's 9 norms (2 a block, 4 blocks, and the last) keeps one [micro-batch, seq,
    hidden] float32 tensor more at the peak; with every block checkpointed only the last norm, outside them. torch
    2.2 traces as today's."""
    from gaplan.core.checkpointing import parse_checkpointing
    from gaplan.estimate import trace_steps
    from gaplan.workload.spec import WorkloadSpec

    script = _script()
    spec = WorkloadSpec(model="tiny-llama", seq_len=128, dtype="bf16", weights_dtype="fp32", optimizer="adamw",
                        grad_checkpointing=parse_checkpointing(checkpointing))  # hidden 256, 4 blocks
    peaks = {}
    for torch_version in (None, "2.1", "2.2"):
        with script.older_autograd(torch_version):
            (row,) = trace_steps(spec, [4], device_kind="cuda")
        peaks[torch_version] = row.activations
    squares = 4 * 128 * 256 * 4  # micro-batch x seq x hidden, float32
    assert peaks["2.1"] - peaks[None] == squares * (9 if checkpointing == "off" else 1)
    assert peaks["2.2"] == peaks[None]


def test_only_a_torch_before_1_11_keeps_softmax_input_and_before_2_2_means():
    import torch

    script = _script()
    kept = {"softmax": (torch.Tensor, "softmax"), "mean": (torch.Tensor, "mean"), "torch.mean": (torch, "mean")}
    originals = {name: getattr(owner, attribute) for name, (owner, attribute) in kept.items()}
    for version, patched in ((None, ()), ("1.9", ("softmax", "mean", "torch.mean")),
                             ("1.10", ("softmax", "mean", "torch.mean")), ("1.11", ("mean", "torch.mean")),
                             ("2.1", ("mean", "torch.mean")), ("2.2", ()), ("2.13", ())):
        with script.older_autograd(version):
            now = {name for name, (owner, attribute) in kept.items()
                   if getattr(owner, attribute) is not originals[name]}
            assert now == set(patched), version
        assert all(getattr(owner, attribute) is originals[name] for name, (owner, attribute) in kept.items())


def test_a_direct_softmax_call_is_still_upcast_by_the_cuda_device_model_and_keeps_one_input():
    """``scores.softmax(-1)`` (not through ``F.softmax``) under fp16 autocast: the device model still runs it in
    float32 (it picks ops by name), and the input is packed once besides the output."""
    import torch

    from gaplan.estimate.device import CudaAutocastFp32

    script = _script()
    packed = []

    def pack(tensor):
        packed.append(tensor.dtype)
        return tensor

    scores = torch.randn(2, 3, 8, 8, dtype=torch.float16, requires_grad=True) * 1
    for torch_version, kept in ((None, [torch.float32]), ("1.10", [torch.float32, torch.float32])):
        packed.clear()
        with script.older_autograd(torch_version), torch.autocast("cpu", dtype=torch.float16), CudaAutocastFp32():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                out = scores.softmax(-1)
        assert out.dtype == torch.float32
        assert packed == kept


@pytest.mark.parametrize(("old_torch", "op"), [("1.10", "softmax"), ("2.1", "mean"), ("2.1", "torch.mean")])
def test_an_old_torchs_kept_input_is_freed_by_its_backward_and_the_gradients_are_todays(old_torch, op):
    """torch 1.10's softmax input, torch 2.1's mean input: kept after forward (not in a checkpointed block, whose
    recomputation keeps it), gone after backward; the gradients are today's."""
    import weakref

    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    script = _script()
    softmax, mean = torch.Tensor.softmax, torch.mean
    run = {"softmax": lambda t: F.softmax(t, dim=-1), "mean": lambda t: t.mean(-1, keepdim=True).exp(),
           "torch.mean": lambda t: torch.mean(t, dim=-1, keepdim=True).exp()}[op]
    inputs = []

    def block(x):
        made = x * 2
        inputs.append(weakref.ref(made))
        return run(made)

    weights = torch.randn(3, 5)
    grads = []
    for torch_version, checkpointed in ((None, False), (old_torch, False), (old_torch, True)):
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
        with script.older_autograd(torch_version):
            out = checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
            kept_after_forward = inputs[-1]() is not None
            (out * weights).sum().backward()
        assert kept_after_forward == (torch_version == old_torch and not checkpointed)
        assert all(ref() is None for ref in inputs)
        grads.append(x.grad)
    assert torch.Tensor.softmax is softmax and torch.mean is mean  # put back
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(grads[2], grads[0])


def test_the_torchtitan_rows_figures_the_page_states_are_the_results_files():
    """The two FSDP rows: each one's error, the gradient blocks counted, and the 8 -> 128 ranks difference with and
    without them, as the page says them."""
    text = " ".join(PAGE.read_text().split())
    rows = {r["id"]: r for r in RESULTS["rows"] if r["id"].startswith("torchtitan")}
    eight, many = rows["torchtitan-llama-3.1-8b-fsdp8"], rows["torchtitan-llama-3.1-8b-fsdp128"]
    gib = 1024**3
    for row in (eight, many):
        assert f"`{row['id']}` ({row['error_pct']:+.1f}%)" in text
        assert row["nccl_bytes_left_out"] == 256 * 2**20
    assert f"+{eight['gradient_pool_bytes'] / gib:.2f} and +{many['gradient_pool_bytes'] / gib:.2f} GiB" in text
    drop = (eight["estimated_bytes"] - many["estimated_bytes"]) / gib
    without = drop - (eight["gradient_pool_bytes"] - many["gradient_pool_bytes"]) / gib
    assert f"the estimate's -{drop:.2f} (-{without:.1f} without it)" in text
    estimate_page = " ".join((ROOT / "docs" / "estimate.md").read_text().split())
    assert f"which read {-eight['error_pct']:.1f}% and {-many['error_pct']:.1f}% low" in estimate_page
    assert f"reads {eight['error_pct']:+.1f}% ({eight['estimated_bytes'] / gib:.2f} GiB against 82.4)" in text
    published = (eight["published_bytes"] - many["published_bytes"]) / gib
    assert f"ranks is -{published:.1f} GiB" in text
    # With the two terms not counted at their largest: the last block, the all-gather stream's cache.
    largest = {8: (0.41 + 2.20) * gib, 128: (0.41 + 1.97) * gib}
    assert [round(100 * (r["estimated_bytes"] + largest[ranks] - r["published_bytes"]) / r["published_bytes"], 1)
            for ranks, r in ((8, eight), (128, many))] == [-1.5, 1.0]
    assert "with the two above at their largest, -1.5% and +1.0%" in text
    cached = [f"{r['segment_bytes'] / gib:.2f}" for r in (eight, many)]
    assert f"{cached[0]} GiB of wholly free cached segments on 8 ranks, {cached[1]} on 128" in text


@pytest.mark.heavy
@pytest.mark.slow
def test_the_torchtitan_row_estimates_as_recorded_and_its_checkpointing_is_the_save_list():
    """The 8-rank row re-traced (about 10 s a trace on 2 cores), and full checkpointing instead of the op-level policy:
    the difference in tensors is the page's 27.06 GiB, the save list's hand sum over 32 blocks."""
    script = _script()
    row = next(r for r in ROWS if r["id"] == "torchtitan-llama-3.1-8b-fsdp8")
    recorded = next(r for r in RESULTS["rows"] if r["id"] == row["id"])
    assert script.estimate_row(row)["estimated_bytes"] == recorded["estimated_bytes"]
    full = script.estimate_row(dict(row, settings=dict(row["settings"], grad_checkpointing="on")))
    saved = (recorded["estimated_bytes"] - full["estimated_bytes"]) / 1024**3
    text = " ".join(PAGE.read_text().split())
    assert f"takes {saved:.2f} GiB off the estimate" in text

    def tensors(result):  # the traced peak without the allocator's segments
        return result["traced_peak_bytes"] - result["unfilled_segment_bytes"]

    assert f"{(tensors(recorded) - tensors(full)) / 1024**3:.2f} GiB of tensors, the hand sum" in text
