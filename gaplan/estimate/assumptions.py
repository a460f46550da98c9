"""The assumptions of an estimate, as data: one :class:`Assumption` per thing the trace could not see.

Each record has a ``topic`` (one of :data:`TOPICS`), the sentence a person reads (``text``) and the
figures it states (``values``), so a program can check them without parsing prose. Rendering is
one line per record: ``str(assumption)`` is its text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gaplan.core.units import format_bytes
from gaplan.devices.reserve import CONTEXT_BYTES, NCCL_MAX_CHANNELS, NCCL_RING_PEERS
from gaplan.estimate.allocator import allocator_text
from gaplan.estimate.attention import describe_calls
from gaplan.estimate.compiled import EAGER_TEXT, TRACED_TEXT
from gaplan.estimate.device import (
    CPU_HEAP_BYTES,
    CPU_HEAP_BYTES_PER_NODE,
    MKL_PANEL_K,
    MKL_PANEL_N,
    WORKSPACE_BYTES_HOPPER,
    DeviceModel,
    cpu_heap_bytes,
)

TOPICS = ("budget", "steady-state", "cpu-process", "allocator", "optimizer", "attention", "mixed-precision",
          "convolutions", "outside-pytorch", "sharding", "data-parallel", "lora", "quantization", "loss")


@dataclass(frozen=True)
class Assumption:
    """One assumption: what it is about, the sentence, and the figures in it (bytes are ints)."""

    topic: str
    text: str
    values: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "text": self.text, "values": dict(self.values)}


# --- the budget ---------------------------------------------------------------------------------------------------


def cpu_budget(limit: int) -> Assumption:
    return Assumption("budget", f"CPU budget {format_bytes(limit)} above the process baseline, as gaplan probe's budget "
                                "on CPU; nothing reserved.", {"limit_bytes": limit, "usable_bytes": limit})


def target_budget(target, memory_limit: int | None, usable: int) -> Assumption:
    """A target's memory less its reserve, and the memory limit when it is the smaller (``usable`` then)."""
    text = (f"Target {target.name} ({target.description}): {format_bytes(target.total_bytes)} reported by the driver, "
            f"less {format_bytes(target.context_bytes)} for the CUDA context (driver state, lazily loaded kernels) and "
            f"{format_bytes(target.workspace_bytes)} for cuBLAS/cuBLASLt workspaces, leaves "
            f"{format_bytes(target.usable_bytes)} for tensors.")
    values = {"target": target.name, "total_bytes": target.total_bytes, "context_bytes": target.context_bytes,
              "workspace_bytes": target.workspace_bytes, "usable_bytes": usable}
    if memory_limit is not None:
        text += (f" The memory limit {format_bytes(memory_limit)} is smaller: it is taken as the card's memory, less "
                 f"the same context and workspaces: {format_bytes(usable)} for tensors.")
        values["limit_bytes"] = memory_limit
    return Assumption("budget", text, values)


def limit_budget(memory_limit: int, usable: int) -> Assumption:
    return Assumption(
        "budget",
        f"Memory limit {format_bytes(memory_limit)} taken as the card's memory (as gaplan probe --memory-limit on "
        f"CUDA), less {format_bytes(CONTEXT_BYTES)} allowed for the CUDA context (outside PyTorch's allocator) and "
        f"{format_bytes(WORKSPACE_BYTES_HOPPER)} for cuBLAS/cuBLASLt workspaces (Hopper's, the largest; counted "
        f"here only, the trace holds none): {format_bytes(usable)} for tensors.",
        {"limit_bytes": memory_limit, "context_bytes": CONTEXT_BYTES, "workspace_bytes": WORKSPACE_BYTES_HOPPER,
         "usable_bytes": usable})


def nccl_buffers(nccl_bytes: int, world_size: int) -> Assumption:
    """NCCL's buffers on one of ``world_size`` ranks, added to the peak (:mod:`gaplan.devices.reserve`)."""
    return Assumption(
        "outside-pytorch",
        f"NCCL's buffers on each of the {world_size} ranks, outside PyTorch's allocator and never in a one-process "
        f"trial: {format_bytes(nccl_bytes)} added to the peak (NCCL_BUFFSIZE, 4 MiB by default per NCCL's "
        f"documentation, x {NCCL_MAX_CHANNELS} channels at most (NCCL_MAX_NCHANNELS) x {NCCL_RING_PEERS} ring peers; "
        "an upper bound for the Simple protocol, most topologies open fewer channels).",
        {"nccl_bytes": nccl_bytes, "world_size": world_size, "channels": NCCL_MAX_CHANNELS,
         "peers": NCCL_RING_PEERS})


# --- the trace and the device model -------------------------------------------------------------------------------


def trace_assumptions(spec, device: DeviceModel, observed, static_bytes: int,
                      optimizer_step_bytes: int | None, graph_nodes: int,
                      panel_at_every_peak: bool = False,
                      unfilled_segment_bytes: int | None = None, compiled: bool = False,
                      sharded: bool = False) -> list[Assumption]:
    """What the traces of ``spec`` assumed on ``device``.

    Args:
        spec: the workload spec (its optimizer and dtype).
        device: the device model the traces ran under.
        observed: what the traces saw (``gemm_panel_bytes``, ``attention_ops``, ``convolutions``).
        panel_at_every_peak: MKL's buffer was added to every peak (a tracker that counts no workspace).
        static_bytes: weights, gradients and optimizer states.
        optimizer_step_bytes: the optimizer step's traced bytes (None when it was not traced).
        graph_nodes: a micro-step's autograd nodes (a CPU process's heap grows with them).
        unfilled_segment_bytes: on cuda, the most the allocator's segments held beyond the live blocks at a trace's
            peak (added to it).
        compiled: the model was compiled for the traces and its graphs ran under them (gaplan.estimate.compiled).
        sharded: one rank of an FSDP step (its allocator replays one stream of several).
    """
    notes = [Assumption("steady-state", "Steady state: optimizer states exist and gradients are held across micro-steps, "
                        "so the peak is the larger of the micro-steps' (weights, gradients, optimizer states, one "
                        "micro-batch's activations) and the optimizer step's; batches are full length.")]
    temporaries = max(0, optimizer_step_bytes - static_bytes) if optimizer_step_bytes is not None else 0
    levers = [compiled_model(compiled)] * spec.compile + [offloaded_activations()] * spec.offload_activations
    if device.kind == "cpu":
        return notes + _cpu_process(spec, device, observed, temporaries, graph_nodes, panel_at_every_peak) + levers
    return notes + _cuda(spec, observed, static_bytes, temporaries, unfilled_segment_bytes, sharded) + levers


def _cpu_process(spec, device: DeviceModel, observed, temporaries: int, graph_nodes: int,
                 panel_at_every_peak: bool) -> list[Assumption]:
    panel = observed.gemm_panel_bytes
    heap = cpu_heap_bytes(graph_nodes)
    when = ("at every peak, the largest product's MKL packing buffer" if panel_at_every_peak else
            "while each float32 matrix product runs, its MKL packing buffer")
    notes = [Assumption(
        "cpu-process",
        f"CPU process: traced tensors plus {format_bytes(heap)} of heap ({format_bytes(CPU_HEAP_BYTES)} and "
        f"{format_bytes(CPU_HEAP_BYTES_PER_NODE)} for each of a micro-step's {graph_nodes:,} autograd nodes: Python "
        "objects, autograd's graph), and "
        f"{when} (4 bytes x min(K, {MKL_PANEL_K}) x min(N, {MKL_PANEL_N}), one call's, MKL's pool being off; "
        f"{format_bytes(panel)} for the largest), both measured against gaplan probe's resident-memory peak; no "
        "CUDA adjustment.",
        {"heap_bytes": heap, "graph_nodes": graph_nodes, "threads": device.threads, "mkl_panel_bytes": panel})]
    note = _optimizer(spec.optimizer, "cpu", temporaries, None)
    if note is not None:
        notes.append(note)
    if observed.convolutions:
        notes.append(Assumption("convolutions", "The model runs convolutions: oneDNN's primitive cache and JIT-compiled "
                                "kernels live outside the tensors and are not traced (tens of MiB on the example CNN): "
                                "the estimate is low for them."))
    return notes


def _cuda(spec, observed, static: int, temporaries: int, unfilled: int | None,
          sharded: bool) -> list[Assumption]:
    notes = [allocator_segments(unfilled, sharded)]
    notes.append(_optimizer(spec.optimizer, "cuda", temporaries, static))
    notes.append(_attention(observed.attention_ops, observed.cuda_attention_calls))
    if spec.dtype != "fp32":
        notes.append(Assumption(
            "mixed-precision",
            f"Mixed precision ({spec.dtype} autocast over fp32 weights): traced under CPU autocast with CUDA autocast's "
            "float32 op list applied on top (layer_norm, softmax, log_softmax, pow, exp, sum and the like run in fp32, as "
            "on CUDA); autocast's cached low-precision copies of the weights are counted.", {"dtype": spec.dtype}))
    if observed.convolutions:
        notes.append(Assumption("convolutions", "The model runs convolutions: cuDNN's workspaces, allocated inside the "
                                "kernels, are not traced; the estimate can be low by the largest one "
                                "(torch.backends.cudnn.benchmark favours fast algorithms with large workspaces)."))
    notes.append(Assumption("outside-pytorch", "Nothing else on the GPU (other processes, a display) is counted; NCCL's "
                            "buffers only where ranks talk (a world size above 1)."))
    return notes


def allocator_segments(unfilled: int | None, sharded: bool = False) -> Assumption:
    """The CUDA caching allocator as the estimate models it (:func:`gaplan.estimate.allocator.allocator_text`)."""
    return Assumption("allocator", *allocator_text(unfilled, sharded))


_STATES = {
    "adamw-8bit": "two moments in one byte each (uint8) and a float32 absmax per 256-element block of each, the two "
                  "256-entry quantile maps once; a parameter under 4,096 elements keeps float32 moments",
    "adafactor": "a matrix's second moment factored into a float32 row and column, a vector's in full, and an RMS "
                 "scalar each; no first moment (beta1=None), a fixed learning rate (relative_step and scale_parameter "
                 "off, as the HF Trainer builds it)",
    "lion": "one momentum of the parameter's dtype",
}
_STATES["paged-adamw-8bit"] = _STATES["adamw-8bit"]


def _optimizer(name: str, kind: str, temporaries: int, static: int | None) -> Assumption | None:
    """How the optimizer's states and its step were traced on device ``kind`` (None: nothing to say)."""
    values: dict[str, Any] = {"optimizer": name, "temporaries_bytes": temporaries}
    if name == "adamw" and kind == "cpu":
        return Assumption("optimizer", f"AdamW as PyTorch runs it on CPU (single-tensor): its step's temporaries, "
                          f"{format_bytes(temporaries)}, are traced.", {**values, "implementation": "single-tensor"})
    if name == "adamw":
        return Assumption(
            "optimizer",
            f"AdamW traced with foreach=True, PyTorch's default for CUDA parameters: its step holds one more fp32 copy of "
            f"the second moments, {format_bytes(temporaries)} of temporaries over the {format_bytes(static)} of weights, "
            "gradients and states; fused=True would not (--optimizer adamw-fused).",
            {**values, "implementation": "foreach", "static_bytes": static})
    if name == "adamw-fused":
        return Assumption("optimizer", f"AdamW with fused=True: one kernel updates every parameter in place, traced "
                          f"through torch's fused op ({format_bytes(temporaries)} of temporaries).",
                          {**values, "implementation": "fused"})
    if name == "adamw-forloop":
        return Assumption("optimizer", f"AdamW with foreach=False: one parameter at a time, so its step's temporaries "
                          f"are one parameter's (the last one's denominator beside the next one's two: up to three "
                          f"copies of the largest), {format_bytes(temporaries)}, traced.",
                          {**values, "implementation": "for-loop"})
    if name == "sgd":
        return None if kind == "cpu" else Assumption(
            "optimizer", "SGD traced with foreach=True, PyTorch's default for CUDA parameters (no momentum: no "
            "temporaries).", {**values, "implementation": "foreach"})
    text = f"{name}: {_STATES[name]}; "
    if name.endswith("8bit") and kind == "cuda":
        text += "the step is bitsandbytes' fused CUDA kernel, traced as allocating nothing"
    elif name.endswith("8bit"):
        text += f"the step runs bitsandbytes' CPU kernel, traced op by op ({format_bytes(temporaries)} of temporaries)"
    else:
        text += f"its step's temporaries, {format_bytes(temporaries)}, are traced"
    if name == "paged-adamw-8bit":
        text += ("; paged: states of 100,000 elements or more live in CUDA unified memory, outside PyTorch's allocator, "
                 "counted here on the GPU where they rest (under memory pressure the driver moves them to the host, "
                 "which this estimate does not credit)")
    return Assumption("optimizer", text + ".", values)


def chunked_loss(chunk_tokens: int, vocab_size: int | None) -> Assumption:
    """The chunked loss, as traced: one chunk's logits at a time, recomputed in backward."""
    logits = 4 * chunk_tokens * (vocab_size or 0)
    return Assumption(
        "loss",
        f"Chunked loss (--loss chunked): the output head and cross-entropy run {chunk_tokens} positions at a time "
        f"under activation checkpointing, so one chunk's logits ({format_bytes(logits)} in fp32 at vocabulary "
        f"{vocab_size or '?'}) exist at a time and are made again in backward: traced as it runs.",
        {"chunk_tokens": chunk_tokens, "vocab_size": vocab_size, "chunk_logits_bytes": logits})


def offloaded_activations() -> Assumption:
    """``--offload-activations``: how the trace runs torch's ``save_on_cpu`` (:mod:`gaplan.estimate.offload`)."""
    return Assumption("offload", "Activation offloading (--offload-activations, torch's save_on_cpu): every tensor "
                      "saved for backward leaves the device in forward and comes back, a fresh copy, while its node's "
                      "backward runs (a weight a product saved comes back as a copy too); the pinned host memory "
                      "holding them is not counted, and the copies' time is the lever table's, not the estimate's.")


def compiled_model(traced: bool) -> Assumption:
    """``--compile``: traced as inductor partitions the step (``traced``: one process), or the eager model."""
    return Assumption("compile", TRACED_TEXT if traced else EAGER_TEXT)


def _attention(ops, calls) -> Assumption:
    """The attention kernel each SDPA call takes on CUDA (``calls``, :mod:`gaplan.estimate.attention`), else the
    kernel the trace took."""
    if calls:
        backends = sorted({call.backend for call in calls})
        text = (f"Attention on CUDA, call by call by PyTorch's rule (flash for fp16/bf16 with a head size up to 256 and "
                f"no mask tensor; else memory-efficient, which takes fp32 and masks but not grouped-query heads; else "
                f"math): {describe_calls(calls)}. Flash and memory-efficient keep the output and an fp32 log-sum-exp "
                "(traced through the CPU's flash kernel, which keeps the same)")
        if "math" in backends:
            text += ("; math keeps the seq x seq probabilities, and is traced so: no fused CUDA kernel takes fp32 "
                     "with grouped-query heads (transformers passes enable_gqa when the batch needs no mask; bf16 "
                     "runs flash)")
        text += (". The trace reads the batch as full length, so transformers drops its padding mask as on a real "
                 "run (--attention eager keeps the probabilities instead).")
        return Assumption("attention", text, {"kernel": "+".join(backends), "calls": [c._asdict() for c in sorted(
            calls, key=lambda c: (c.backend, c.head_size, c.dtype, c.mask, c.grouped))]})
    if any("flash" in op or "efficient" in op for op in ops):
        return Assumption("attention", "Attention: traced through PyTorch's fused scaled_dot_product_attention kernel "
                          "(flash on CPU), which keeps the output and an fp32 log-sum-exp, no seq x seq probabilities. "
                          "The trace reads the batch as full length, so transformers drops its padding mask as on a "
                          "real run (--attention eager keeps the probabilities instead).", {"kernel": "fused"})
    if any("math" in op for op in ops):
        return Assumption("attention", "Attention: the trace took scaled_dot_product_attention's math path, which keeps "
                          "seq x seq probabilities.", {"kernel": "math"})
    return Assumption("attention", "Attention: the model computes it eagerly (seq x seq probabilities kept), as it would "
                      "on CUDA.", {"kernel": "eager"})


# --- several ranks ------------------------------------------------------------------------------------------------


def sharded_assumptions(spec, device_kind: str, world_size: int, blocks: int, depths, held_gradient_bytes: int = 0,
                        one_micro_step_batch: int | None = None) -> list[Assumption]:
    """What a traced rank of a ``world_size``-way FSDP2 step assumed.

    ``held_gradient_bytes``: the unsharded gradients an accumulated micro-step's peak held (``--grad-sync last``);
    ``one_micro_step_batch``: the plan's micro-batch when the plan has one micro-step (no accumulation), else None.
    """
    depth_text = (f"all {blocks} blocks traced" if len(depths) == 1 else
                  f"its {blocks} identical blocks traced at depths {' and '.join(map(str, depths))} and every category "
                  f"extrapolated to {blocks} along the line through them")
    notes = [Assumption(
        "sharding",
        f"FSDP2 over {world_size} ranks, one rank traced (rank 0, which holds the largest shards: dimension 0 split in "
        f"ceil(rows / {world_size}), padded) on a fake process group: fully_shard per block and on the root as training "
        f"does it, reshard after forward, one block prefetched in backward; {depth_text}. The communication "
        "backend's own buffers are not in the trace: NCCL's are added on CUDA (below), gloo's on the CPU are not "
        "counted.",
        {"world_size": world_size, "blocks": blocks, "traced_depths": list(depths)})]
    if spec.dtype != "fp32":
        notes.append(Assumption(
            "sharding",
            f"FSDP's MixedPrecisionPolicy (as training sets it): parameters gathered in {spec.dtype} for compute, "
            f"gradients reduced in fp32, the shards kept in {spec.weights_dtype}; autocast runs over the gathered "
            f"{spec.dtype} weights, so it caches no copies of them.", {"param_dtype": spec.dtype, "reduce_dtype": "fp32"}))
    if spec.grad_sync == "last":
        held = f" ({format_bytes(held_gradient_bytes)} on this rank)" if held_gradient_bytes else ""
        accumulated = (
            "Gradients reduce-scattered on the last micro-step only (--grad-sync last): each micro-step before the last "
            f"leaves the whole model's unsharded gradients{held} (fp32 under mixed precision) on every rank, held into "
            "the next, so the peak of a step with accumulation (B*'s) is charged with them. --grad-sync every keeps "
            "them sharded (less memory, a reduce-scatter per micro-step).")
        if one_micro_step_batch is None:
            notes.append(Assumption("sharding", accumulated, {"grad_sync": "last", "plan_micro_steps": None}))
        else:
            notes.append(Assumption(
                "sharding",
                f"{accumulated} The plan has one micro-step (micro-batch {one_micro_step_batch}, no accumulation): no "
                "earlier micro-step holds unsharded gradients, so the plan's step is traced with one micro-step and "
                "charged none; a rank's gradients are unsharded only per block, until its reduce-scatter.",
                {"grad_sync": "last", "plan_micro_steps": 1}))
    else:
        notes.append(Assumption(
            "sharding", "Gradients reduce-scattered on every micro-step (--grad-sync every): only sharded gradients are "
            "held between micro-steps.", {"grad_sync": "every"}))
    if spec.cpu_offload:
        where = ("in host memory and not counted on the GPU (their bytes are reported as host bytes)"
                 if device_kind == "cuda" else "in the same CPU process (a CPU estimate counts them)")
        notes.append(Assumption(
            "sharding",
            f"--cpu-offload: sharded parameters, gradients and optimizer states live {where}; the optimizer step runs on "
            "the CPU. Each block's shard copied to the device before its all-gather is not counted (1/"
            f"{world_size} of a block).", {"cpu_offload": True}))
    return notes


def data_parallel_buckets(grad_bytes: int, world_size: int) -> Assumption:
    return Assumption(
        "data-parallel",
        f"DistributedDataParallel over {world_size} ranks: its gradient buckets, a flat copy of the gradients "
        f"({format_bytes(grad_bytes)}), are added to every step (gradient_as_bucket_view is off, as gaplan trains).",
        {"world_size": world_size, "bucket_bytes": grad_bytes})


def lora_adapters(spec, frozen_bytes: int, trainable: int, trainable_bytes: int) -> Assumption:
    """LoRA: what is frozen (weights only) and what trains (adapters: weights, gradients, optimizer states)."""
    targets = spec.lora_targets or "peft's default for the architecture"
    return Assumption(
        "lora",
        f"LoRA r={spec.lora_r} (alpha {spec.lora_alpha:g}, dropout {spec.lora_dropout:g}) on {targets}: the frozen base, "
        f"{format_bytes(frozen_bytes)} in {spec.weights_dtype}, has no gradients or optimizer states; the "
        f"{trainable:,} adapter parameters ({format_bytes(trainable_bytes)}) have both.",
        {"lora_r": spec.lora_r, "frozen_bytes": frozen_bytes, "trainable_parameters": trainable,
         "trainable_bytes": trainable_bytes})


def quantized_weights(quantized, spec) -> Assumption:
    """QLoRA: the 4-bit base as modelled (bytes per weight, what stays in full precision, the dequantized copy)."""
    from gaplan.estimate.quantized import BYTES_PER_WEIGHT_OF, NESTED_BLOCK, NF4_BLOCK

    per_weight = BYTES_PER_WEIGHT_OF[spec.quantize]
    layout = (f"nf4 with double quantization, {per_weight:.4f} bytes per weight (a 4-bit code, an 8-bit absmax per "
              f"{NF4_BLOCK}, an fp32 scale per {NESTED_BLOCK} absmaxes)" if spec.quantize == "4bit" else
              f"nf4 without double quantization, {per_weight:.4f} bytes per weight (a 4-bit code, an fp32 absmax per "
              f"{NF4_BLOCK})")
    own = quantized.own
    layers = (f"the {quantized.layers} frozen nn.Linear layers of the module:function model (its head included)" if own
              else f"the {quantized.layers} frozen linear layers of the base (GPT-2's Conv1D too)")
    kept = ("as the function built them; the rest (its adapters, embeddings, norms) stays as traced" if own else
            f"in {spec.weights_dtype}; embeddings, norms, the output head and the adapters stay as traced")
    return Assumption(
        "quantization",
        f"{'A 4-bit base' if own else 'QLoRA'} (--quantize {spec.quantize}): {layers} in bitsandbytes' {layout}: "
        f"{format_bytes(quantized.quantized_bytes)} instead of {format_bytes(quantized.traced_bytes)} {kept}. Each "
        f"4-bit layer dequantizes its weight to {'its own dtype' if own else 'the compute dtype'} for each of its "
        f"products, forward and backward, and frees it after: counted at that product's moment (the largest copy "
        f"{format_bytes(quantized.dequantized_bytes)}). bitsandbytes' kernels' own workspace is not counted. "
        + ("Checked against the layers bitsandbytes builds, not against a probe's peak; not yet checked on a GPU." if own
           else "Within 3% of QLoRA's probe on the CPU (bitsandbytes' CPU backend); not yet checked on a GPU."),
        {"layers": quantized.layers, "quantized_bytes": quantized.quantized_bytes,
         "traced_bytes": quantized.traced_bytes, "dequantized_bytes": quantized.dequantized_bytes,
         "bytes_per_weight": per_weight})
