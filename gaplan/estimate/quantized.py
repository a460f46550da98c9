"""QLoRA's frozen base as the estimate models it: bitsandbytes' 4-bit nf4 weights with double quantization.

The trace runs the LoRA model with its base in ``--weights-dtype``; this takes the quantized layers' weights
from their traced bytes to 4-bit bytes, and gives the trace the dequantized copy a 4-bit layer makes for each of its
products, forward and backward (bitsandbytes' ``MatMul4Bit`` dequantizes, multiplies, and lets the copy go): a
workspace counted at that product's moment, over what is live then. The layers are those gaplan's QLoRA quantizes
(:func:`gaplan.workload.quantize.quantized_layers`, transformers' rule): every ``nn.Linear`` and GPT-2 ``Conv1D``
of the base but the output head, not the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gaplan.workload.spec import DTYPE_BYTES

NF4_BLOCK = 64  # weights per absmax (bitsandbytes' nf4 default)
NESTED_BLOCK = 256  # absmaxes per fp32 scale of the second quantization (double quant)
# Per weight, with double quantization (--quantize 4bit): a 4-bit code, an 8-bit absmax per block, and an fp32 scale
# per NESTED_BLOCK absmaxes.
BYTES_PER_WEIGHT = 0.5 + 1 / NF4_BLOCK + 4 / (NF4_BLOCK * NESTED_BLOCK)
# Without it (--quantize nf4): a 4-bit code and an fp32 absmax per block (bitsandbytes' quantize_4bit with
# compress_statistics=False: ``absmax = torch.zeros((blocks,), dtype=torch.float32)``, kept as it is).
BYTES_PER_WEIGHT_NF4 = 0.5 + 4 / NF4_BLOCK
BYTES_PER_WEIGHT_OF = {"4bit": BYTES_PER_WEIGHT, "nf4": BYTES_PER_WEIGHT_NF4}


@dataclass(frozen=True)
class QuantizedBase:
    """What 4-bit quantization changes in a traced LoRA model's memory."""

    layers: int  # linear layers quantized
    traced_bytes: int  # their weights as traced (in --weights-dtype)
    quantized_bytes: int  # the same weights in 4-bit nf4 (with double quantization for --quantize 4bit)
    dequantized_bytes: int  # the largest layer's weight in the compute dtype: held while that layer computes
    own: bool = False  # a module:function model's frozen nn.Linear layers, each computing in its weight's dtype
    # The traced weights' storages (views share them) -> the bytes of that layer's dequantized copy.
    copies: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def saved_bytes(self) -> int:
        return self.traced_bytes - self.quantized_bytes

    def dequantized_copy(self, func: Any, args: tuple) -> int:
        """The workspace of ``func(*args)`` in the trace: a product of a 4-bit layer's weight holds its dequantized
        copy while it runs. A weight autocast has cast first is not matched: the traced cast is that copy."""
        from gaplan.estimate.device import product_operands

        operands = product_operands(func, args)
        return 0 if operands is None else max(self.copies.get(m.untyped_storage()._cdata, 0) for m in operands)


def quantized_base(model: Any, compute_dtype: str | None, quantize: str = "4bit", run: QLoRARun | None = None,
                   own: bool = False) -> QuantizedBase:
    """The 4-bit accounting of ``model``'s frozen linear layers (a PeftModel: adapters and heads excluded, unless
    ``run.quantize_head``; ``own``, a ``module:function`` model: every frozen ``nn.Linear``). ``compute_dtype`` None:
    each layer computes in its weight's own dtype, as gaplan builds a ``module:function`` model's 4-bit layers. With
    ``run.quant_state_dtype`` other than the compute dtype (weights quantized from another dtype), each copy is
    dequantized in that dtype and cast: both are held at the cast, counted as one workspace with the product."""
    from gaplan.workload.build import DTYPES
    from gaplan.workload.quantize import quantized_layers

    run = run or QLoRARun()
    weights = [module.weight for module in quantized_layers(model, head=run.quantize_head, own=own).values()]
    name_of = {dtype: name for name, dtype in DTYPES.items()}

    def copy_bytes(weight: Any) -> int:
        dtype = compute_dtype or name_of.get(weight.dtype)
        per_element = DTYPE_BYTES[compute_dtype] if compute_dtype else weight.element_size()
        if run.quant_state_dtype and run.quant_state_dtype != dtype:
            per_element += DTYPE_BYTES[run.quant_state_dtype]
        return weight.numel() * per_element

    return QuantizedBase(layers=len(weights), traced_bytes=sum(w.numel() * w.element_size() for w in weights),
                         quantized_bytes=int(sum(w.numel() for w in weights) * BYTES_PER_WEIGHT_OF[quantize]),
                         dequantized_bytes=max((copy_bytes(w) for w in weights), default=0), own=own,
                         copies={w.untyped_storage()._cdata: copy_bytes(w) for w in weights})


# bitsandbytes before 0.43.2 kept each 4-bit product's input on its autograd context, ``ctx.tensors = (A, B)`` in
# ``MatMul4Bit.forward`` (bitsandbytes/autograd/_functions.py at 0.42.0), though backward reads only B. Commit
# 9e753741 ("fix QLoRA mem bug: delete useless buffered activation", #1270), first released in 0.43.2, made it
# ``(None, B)``. An attribute of ``ctx`` is not a saved tensor: backward does not free it; it goes with the graph.
KEEPS_INPUTS_BEFORE = (0, 43, 2)
BUILT_WITH = "0.46.1"  # the bitsandbytes gaplan's own QLoRA needs (pyproject's qlora extra)


def release(version: str) -> tuple[int, ...]:
    """``"0.42.0"`` -> ``(0, 42, 0)`` (a local or pre-release suffix ignored)."""
    import re

    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


@dataclass(frozen=True)
class QLoRARun:
    """How a QLoRA run's bitsandbytes and training loop hold the 4-bit layers' inputs: what an estimate of another
    program's run (a published figure) needs; gaplan's own runs are ``QLoRARun()``.

    ``bitsandbytes``: the version it ran; before 0.43.2 every 4-bit product whose input needs a gradient keeps
    that input until its autograd graph is freed (:data:`KEEPS_INPUTS_BEFORE`).
    ``graph_held_to_next_forward``: the loop keeps the step's output, and with it the graph, after backward until
    the next forward has made its own (LitGPT's ``fit`` holds ``logits`` until ``logits = model(...)`` rebinds it),
    so the inputs the last micro-step kept, and its output, are still there through the next one's forward.
    ``output_bytes``: the bytes per element of that held output (4: Fabric's ``convert_output`` casts a module's
    floating outputs to the default dtype, float32); 0: as the head makes it.
    ``quantize_head``: the output head is quantized too (Fabric's ``BitsandbytesPrecision`` replaces every
    ``torch.nn.Linear``, LitGPT's ``lm_head`` included).
    ``quant_state_dtype``: the dtype the weights were quantized from, which bitsandbytes dequantizes to before
    casting to the compute dtype ("fp16" with Fabric, which quantizes ``weight.to(torch.half)``); None: the compute
    dtype, as transformers quantizes.
    """

    bitsandbytes: str = BUILT_WITH
    graph_held_to_next_forward: bool = False
    output_bytes: int = 0
    quantize_head: bool = False
    quant_state_dtype: str | None = None

    @property
    def keeps_inputs(self) -> bool:
        return release(self.bitsandbytes) < KEEPS_INPUTS_BEFORE


class KeptInputs:
    """The inputs an old bitsandbytes' 4-bit layers keep, as fake tensors held through a traced micro-step.

    A forward pre-hook on each quantized layer keeps its input (one per storage: q, k and v read one tensor) when it
    needs a gradient; they go after the micro-step, with its graph. With ``graph_held_to_next_forward``, the last
    micro-step's are there too until the output head has run: stand-ins of the same size, made as each layer runs
    (the forward's own peak is at its end, where all of them exist), freed when the head's forward returns.
    """

    def __init__(self, model: Any, run: QLoRARun, own: bool = False) -> None:
        self.model, self.run, self.own = model, run, own
        self.current: list[Any] = []
        self.previous: list[Any] = []
        self.seen: set[int] = set()
        self.kept_bytes = 0  # one micro-step's kept inputs, the largest traced

    def __enter__(self) -> KeptInputs:
        import torch

        from gaplan.workload.quantize import quantized_layers

        def keep(module: Any, args: tuple) -> None:
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor) or not (torch.is_grad_enabled() and x.requires_grad):
                return
            storage = x.untyped_storage()._cdata
            if storage in self.seen:
                return
            self.seen.add(storage)
            self.current.append(x)
            if self.run.graph_held_to_next_forward:
                self.previous.append(torch.empty_like(x))

        def head_starts(module: Any, args: tuple) -> None:  # the last forward's output, held until the head returns
            x = args[0] if args else None
            if self.run.graph_held_to_next_forward and isinstance(x, torch.Tensor):
                size = self.run.output_bytes or x.element_size()
                rows = x.numel() // x.shape[-1]
                self.previous.append(torch.empty(rows * module.weight.shape[0] * size, dtype=torch.uint8,
                                                 device=x.device))

        def head_done(*_: Any) -> None:
            self.previous.clear()

        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        layers = quantized_layers(self.model, head=self.run.quantize_head, own=self.own).values()
        self.handles = [layer.register_forward_pre_hook(keep) for layer in layers]
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        if head is not None:
            self.handles += [head.register_forward_pre_hook(head_starts), head.register_forward_hook(head_done)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.kept_bytes = max(self.kept_bytes, sum(x.numel() * x.element_size() for x in self.current))
        self.current.clear()
        self.previous.clear()
        self.seen.clear()
