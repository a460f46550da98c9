"""gaplan's estimate against GPU peak memory that others measured and published (docs/estimate-vs-published.md).

Each expressible row of ``docs/data/published_gpu.json`` is traced at its own micro-batch on fake tensors
(:func:`gaplan.estimate.trace_steps`, nothing allocated) and compared in the row's own kind:

* ``allocated`` (``torch.cuda.max_memory_allocated``): the traced peak plus the target's cuBLAS/cuBLASLt workspaces,
  which PyTorch takes from its caching allocator, less what the allocator's segments held beyond the live blocks;
* ``reserved``: the traced peak (every tensor at its allocator block, and what the segments holding live blocks
  held beyond them) plus the workspaces and the wholly free cached segments a run with room keeps reserved,
  and under FSDP2 the sharded gradients' blocks: FSDP2 allocates them in its reduce-scatter stream
  (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``), and once ``zero_grad`` frees them the caching
  allocator keeps them cached for that stream alone, reserved but free when the next step peaks in the main stream;
* ``allocated`` and ``reserved`` leave out NCCL's buffers, which the estimate of a sharded step adds and which are not
  the caching allocator's;
* ``nvidia-smi``: that plus the CUDA context the source itself measured (``context_mib``); a row without one would
  take gaplan's own allowance and say so.

The trace runs the installed torch's autograd. A row run on an older torch whose autograd kept more for backward says
so (``settings.torch``), and its trace keeps that too (:func:`older_autograd`): before 1.11, softmax kept its input;
before 2.2, mean kept its input.

    python examples/published_gpu_check.py                       # every row, a Markdown table (about 15 s a row)
    python examples/published_gpu_check.py --only hf-bert-vanilla
    python examples/published_gpu_check.py --json docs/data/published_gpu_results.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ROOT / "docs" / "data" / "published_gpu.json"
RESULTS = ROOT / "docs" / "data" / "published_gpu_results.json"
GiB = 1024**3
UNITS = {"MiB": 1024**2, "GB": 10**9, "GiB": GiB}
KINDS = ("allocated", "reserved", "nvidia-smi")


def load_rows() -> list[dict]:
    return json.loads(ROWS.read_text())


def published_bytes(row: dict) -> int:
    return round(row["published"]["value"] * UNITS[row["published"]["unit"]])


def spec_of(row: dict):
    """The row's settings as gaplan's workload."""
    from gaplan.core.checkpointing import parse_checkpointing
    from gaplan.workload.spec import WorkloadSpec

    s = row["settings"]
    lora = s.get("lora") or {}
    return WorkloadSpec(model=str(ROOT / row["config"]), task=s["task"], seq_len=s["seq_len"], dtype=s["dtype"],
                        parallel=s.get("parallel", "ddp"),
                        weights_dtype=s["weights_dtype"], optimizer=s["optimizer"],
                        grad_checkpointing=parse_checkpointing(s["grad_checkpointing"]), attention=s.get("attention"),
                        lora=bool(lora),
                        lora_r=lora.get("r", 16), lora_alpha=float(lora.get("alpha", 32)),
                        lora_dropout=lora.get("dropout", 0.05), lora_targets=lora.get("targets"),
                        quantize=s.get("quantize"))


def qlora_run_of(row: dict):
    """A QLoRA row's bitsandbytes and loop (``settings.qlora_run``), or None: gaplan's own."""
    from gaplan.estimate.quantized import QLoRARun

    run = row["settings"].get("qlora_run")
    return QLoRARun(**run) if run else None


# What autograd once kept for backward and today's does not, with the first release that stopped, as (major, minor):
# * softmax's input, besides its output, only for its dtype: 1.9 and 1.10 kept it (SoftmaxBackward's, in 1.10
#   SoftmaxBackward0's, _saved_self); 1.11 does not (pytorch/pytorch#66018, "Avoid saving self for softmax and
#   log_softmax");
# * mean's input, only for its element count: 2.1.0's MeanBackward0/1 hold `SavedVariable self_` (the wheel's
#   Functions.h), 2.2.0's `self_sym_numel` (pytorch/pytorch#109935, "Avoid saving self for mean.backward").
SOFTMAX_INPUT_DROPPED_IN = (1, 11)
MEAN_INPUT_DROPPED_IN = (2, 2)


def torch_release(version: str | None) -> tuple[int, int] | None:
    """``"1.10"`` -> (1, 10); None for a row run on a torch whose autograd keeps what today's does."""
    if not version:
        return None
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int(minor)


def _keeping_input(original, name: str):
    """``original`` (a method or function whose first argument is a tensor), keeping that input until the output's
    node has run its backward, packed through the saved-tensor hooks in force, as autograd's own saved tensors are."""
    from torch.overrides import handle_torch_function, has_torch_function_unary

    from gaplan.estimate.torch_private import private

    top_hooks = private("torch._C._autograd", "_top_saved_tensors_default_hooks")

    def keeping_input(*args, **kwargs):
        self = args[0] if args else kwargs.get("input", kwargs.get("self"))  # torch.mean(input=x) names it
        if has_torch_function_unary(self):  # as the op's own binding does: the modes see the op, then call this
            return handle_torch_function(keeping_input, (self,), *args, **kwargs)
        out = original(*args, **kwargs)
        if out.grad_fn is not None:
            hooks = top_hooks(False)
            kept = {"input": hooks[0](self) if hooks else self}

            def release_after(grad_inputs, grad_outputs):  # the node's backward has run: autograd frees what it saved
                packed = kept.pop("input", None)
                if hooks and packed is not None:
                    hooks[1](packed)

            out.grad_fn.register_hook(release_after)
        return out

    keeping_input.__name__ = keeping_input.__qualname__ = name  # the device model picks ops by name
    return keeping_input


@contextlib.contextmanager
def older_autograd(version: str | None):
    """Trace as the row's torch kept tensors for backward: before 1.11, each softmax's node also kept its input, and
    before 2.2 each mean's, until that node's backward had run. Forward and backward both run inside.

    What is kept is the tensor the op computes on: under autocast, the device model's float32 copy of a softmax's
    input. torch 1.10 on CUDA kept that for float32 and bf16 scores, but for fp16 scores the fp16 input itself
    (``_softmax(..., half_to_float=True)``), half the bytes; the rows that use this (BERT's) had float32 scores in
    their run (docs/estimate-vs-published.md). Only ``Tensor.softmax`` and what calls it (``F.softmax``,
    ``nn.Softmax``) keep their input here: ``torch.softmax`` and ``log_softmax``, which 1.10 also made keep theirs,
    do not (no row's peak holds one of any size). ``torch.mean`` and ``Tensor.mean`` both keep theirs (an RMSNorm's
    squares, in LitGPT's and transformers' Llama).

    The input is packed through the saved-tensor hooks in force (activation checkpointing's, offloading's), as
    autograd's own saved tensors are, so a checkpointed block keeps it only while recomputed, and an offloaded one
    is copied out as the old torch copied it.
    """
    release = torch_release(version)
    import torch

    patched = []
    if release is not None and release < SOFTMAX_INPUT_DROPPED_IN:
        patched.append((torch.Tensor, "softmax"))
    if release is not None and release < MEAN_INPUT_DROPPED_IN:
        patched += [(torch.Tensor, "mean"), (torch, "mean")]
    # (owner, name, original, whether the owner itself held it: Tensor.mean is inherited from TensorBase)
    originals = [(owner, name, getattr(owner, name), name in vars(owner)) for owner, name in patched]
    try:
        for owner, name, original, _ in originals:
            setattr(owner, name, _keeping_input(original, name))
        yield
    finally:
        for owner, name, original, own in originals:
            if own:
                setattr(owner, name, original)
            elif name in vars(owner):
                delattr(owner, name)


def estimate_row(row: dict) -> dict:
    """Trace one row at its micro-batch; the estimate in the row's kind, in bytes, and what went into it."""
    from gaplan.devices.reserve import CONTEXT_BYTES, nccl_buffer_bytes
    from gaplan.estimate import lookup_target, trace_steps

    target = lookup_target(row["target"])
    s = row["settings"]
    world = s.get("world_size", 1)
    started = time.perf_counter()
    with older_autograd(s.get("torch")):
        (traced,) = trace_steps(spec_of(row), [s["micro_batch"]], device_kind="cuda", qlora_run=qlora_run_of(row),
                                world_size=world, accumulated=s.get("accumulated", True))
    seconds = time.perf_counter() - started
    estimate = traced.peak_bytes + target.workspace_bytes
    # The allocator's segments (gaplan.estimate.allocator): max_memory_allocated counts blocks only, so what the
    # segments held beyond them is left out; reserved memory (and nvidia-smi's) keeps the wholly free cached segments.
    segments = -traced.unfilled_segment_bytes if row["kind"] == "allocated" else traced.cached_segment_bytes
    estimate += segments
    sharded = s.get("parallel") == "fsdp"
    nccl = nccl_buffer_bytes(world) if sharded and row["kind"] in ("allocated", "reserved") else 0
    gradient_pool = 0
    if sharded and row["kind"] == "reserved":
        # Full fine-tuning over fp32 weights: the sharded fp32 gradients are the sharded parameters' size.
        assert not s.get("lora") and s["weights_dtype"] == "fp32", row["id"]
        gradient_pool = traced.detail["sharded_parameters"]
    estimate += gradient_pool - nccl
    context = None
    if row["kind"] == "nvidia-smi":
        # The source's own measure of the context where it gives one: gaplan's allowance is a floor, not a measure.
        context = row["context_mib"] * 2**20 if row.get("context_mib") else CONTEXT_BYTES
        estimate += context
    published = published_bytes(row)
    return {"id": row["id"], "model": row["model"], "settings": settings_text(row), "kind": row["kind"],
            "gpu": row["target"], "published_bytes": published, "estimated_bytes": estimate,
            "traced_peak_bytes": traced.peak_bytes, "traced_activations_bytes": traced.activations,
            "workspace_bytes": target.workspace_bytes, "nccl_bytes_left_out": nccl,
            "gradient_pool_bytes": gradient_pool, "segment_bytes": segments,
            "unfilled_segment_bytes": traced.unfilled_segment_bytes,
            "context_bytes": context, "context_from": "source" if row.get("context_mib") else None,
            "error_pct": round(100 * (estimate - published) / published, 2), "seconds": round(seconds, 1)}


def settings_text(row: dict) -> str:
    """One short line of the settings that move memory."""
    s = row["settings"]
    parts = [f"seq {s['seq_len']}", f"mb {s['micro_batch']}", s["dtype"] if s["weights_dtype"] == "fp32"
             else f"{s['dtype']} weights", s["optimizer"]]
    if s["grad_checkpointing"]:
        kind = s["grad_checkpointing"]
        parts.append("checkpointing" if kind is True else f"checkpointing {kind}")
    if s.get("parallel") == "fsdp":
        parts.append(f"FSDP2 over {s['world_size']}" + ("" if s.get("accumulated", True) else ", no accumulation"))
    if s.get("lora"):
        parts.append(f"LoRA r{s['lora']['r']} ({s['lora']['targets']})")
    if s.get("quantize"):
        parts.append(s["quantize"])
    if torch_release(s.get("torch")):
        parts.append(f"torch {s['torch']}")
    return ", ".join(parts)


def render_table(results: dict) -> str:
    """The Markdown table of a results file (the page's generated block is this, verbatim)."""
    lines = ["| row | model | settings | kind | GPU | published GiB | estimated GiB | error |",
             "|---|---|---|---|---|--:|--:|--:|"]
    for r in results["rows"]:
        lines.append(f"| `{r['id']}` | {r['model']} | {r['settings']} | {r['kind']} | {r['gpu']} | "
                     f"{r['published_bytes'] / GiB:.2f} | {r['estimated_bytes'] / GiB:.2f} | {r['error_pct']:+.1f}% |")
    for r in results.get("not_expressible", []):
        lines.append(f"| `{r['id']}` | {r['model']} | {r['settings']} | {r['kind']} | {r['gpu']} | "
                     f"{r['published_bytes'] / GiB:.2f} | not expressible | |")
    return "\n".join(lines)


def summary(results: dict) -> dict:
    """The median absolute error, and the worst row."""
    errors = [r["error_pct"] for r in results["rows"]]
    worst = max(results["rows"], key=lambda r: abs(r["error_pct"]))
    return {"median_abs_error_pct": round(statistics.median(abs(e) for e in errors), 1),
            "median_error_pct": round(statistics.median(errors), 1),
            "worst_id": worst["id"], "worst_error_pct": round(worst["error_pct"], 1),
            "within_5_pct": sum(abs(e) <= 5 for e in errors), "rows": len(errors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="ID", help="only this row (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="write the results here (e.g. docs/data/published_gpu_results.json)")
    args = parser.parse_args(argv)
    rows = load_rows()
    if args.only:
        unknown = set(args.only) - {r["id"] for r in rows}
        if unknown:
            parser.error(f"unknown row(s): {', '.join(sorted(unknown))}")
        rows = [r for r in rows if r["id"] in args.only]
    results = {"rows": [], "not_expressible": []}
    for row in rows:
        if not row["expressible"]:
            results["not_expressible"].append({"id": row["id"], "model": row["model"], "settings": settings_text(row),
                                               "kind": row["kind"], "gpu": row["target"],
                                               "published_bytes": published_bytes(row), "why_not": row["why_not"]})
            continue
        result = estimate_row(row)
        print(f"{row['id']}: {result['error_pct']:+.1f}% ({result['seconds']} s)", file=sys.stderr, flush=True)
        results["rows"].append(result)
    import torch
    import transformers

    results["machine"] = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                          "transformers": transformers.__version__, "python": platform.python_version()}
    if results["rows"]:
        results["summary"] = summary(results)
    print(render_table(results))
    if "summary" in results:
        print(f"\n{json.dumps(results['summary'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
