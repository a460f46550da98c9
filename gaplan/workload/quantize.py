"""QLoRA's frozen base: a built model's linear layers in bitsandbytes' 4-bit nf4, with double quantization
(``--quantize 4bit``, QLoRA's) or without it (``--quantize nf4``, LitGPT's ``bnb.nf4``).

The layers transformers' own bitsandbytes loading would quantize (``replace_with_bnb_linear``, skipping
``get_keys_to_not_convert``: the output head and the embeddings tied to it) become ``bnb.nn.Linear4bit``, and
each one's weight becomes a ``Params4bit`` that bitsandbytes quantizes as it moves to the device, as
transformers' ``Bnb4bitQuantize`` does. The full-precision layers are freed one by one as they are replaced, so a
CUDA device only ever holds the 4-bit weights. GPT-2's ``Conv1D`` weights are transposed first, as transformers does.

bitsandbytes (the ``qlora`` extra) runs nf4 on CUDA and, from 0.46, on the CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from gaplan.core.errors import GaplanError
from gaplan.workload.spec import NEEDS_BITSANDBYTES

QUANT_TYPE = "nf4"
DOUBLE_QUANT = {"4bit": True, "nf4": False}  # --quantize -> bnb_4bit_use_double_quant


@contextlib.contextmanager
def quiet_bitsandbytes() -> Iterator[None]:
    """Inside, importing bitsandbytes (peft imports it too, when installed) logs no warning. Its CPU backend warns
    when the optional ``kernels`` package is missing, and then uses its own kernels: not the user's to act on, and a
    library does not print."""
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def import_bitsandbytes() -> Any:
    """``bitsandbytes``, or a one-line error saying how to install it."""
    try:
        with quiet_bitsandbytes():
            import bitsandbytes
    except ImportError:
        raise GaplanError(NEEDS_BITSANDBYTES) from None
    return bitsandbytes


def quantization_config(compute_dtype: torch.dtype, quantize: str = "4bit") -> Any:
    """The ``transformers.BitsAndBytesConfig`` of gaplan's QLoRA: nf4, double quantization for ``quantize`` "4bit"
    (none for "nf4"), ``compute_dtype``."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANT_TYPE,
                              bnb_4bit_use_double_quant=DOUBLE_QUANT[quantize], bnb_4bit_compute_dtype=compute_dtype,
                              bnb_4bit_quant_storage=torch.uint8)


def quantized_layers(model: nn.Module, head: bool = False, own: bool = False) -> dict[str, nn.Module]:
    """The layers QLoRA puts in 4 bits, by name, under ``model`` or a PeftModel's base: transformers' rule (its
    ``replace_with_bnb_linear``), every ``nn.Linear`` and GPT-2 ``Conv1D`` but what ``get_keys_to_not_convert``
    keeps (the output head and the weights tied to it). A PeftModel's adapters are not among them. ``head``: the
    output head too, as Lightning Fabric's ``BitsandbytesPrecision`` converts every ``nn.Linear`` (the estimate of a
    LitGPT run; gaplan's own build keeps transformers' rule).

    ``own``: a ``module:function`` model, which brings its own adapters: every ``nn.Linear`` under ``model`` whose
    weight is frozen, the head included, as Fabric converts every ``nn.Linear`` (a trainable one cannot be 4-bit).
    One whose weight another parameter holder shares (a head tied to an embedding) is refused in one line: 4 bits
    would give each holder its own copy."""
    if own:
        return _frozen_linears(model)
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kept = get_keys_to_not_convert(base)
    output = base.get_output_embeddings() if head and hasattr(base, "get_output_embeddings") else None
    return {name: module for name, module in base.named_modules()
            if (type(module) is nn.Linear or isinstance(module, Conv1D)) and ".lora_" not in name
            and (should_convert_module(name, kept) or (module is output and type(module) is nn.Linear))}


def _frozen_linears(model: nn.Module) -> dict[str, nn.Module]:
    frozen = {name: module for name, module in model.named_modules()
              if type(module) is nn.Linear and not module.weight.requires_grad}
    if not frozen:
        raise GaplanError("--quantize puts a module:function model's frozen nn.Linear layers in 4 bits, and this "
                          "model has none: freeze its base in the function (requires_grad_(False))")
    holders: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append(f"{name}.{param_name}" if name else param_name)
    for module in frozen.values():
        shared = holders[id(module.weight)]
        if len(shared) > 1:
            raise GaplanError(f"--quantize: {' and '.join(shared)} are one weight; 4 bits would give each its own "
                              "copy: untie them in the function, or leave --quantize out")
    return frozen


def quantize_base(model: nn.Module, compute_dtype: torch.dtype, device: torch.device,
                  quantize: str = "4bit") -> nn.Module:
    """``model`` (built on the CPU, full precision) with its :func:`quantized_layers` in 4-bit on ``device``, the
    rest moved there.

    The model is marked ``is_loaded_in_4bit`` and its config carries the quantization config, as after
    ``from_pretrained(quantization_config=...)``: peft then wraps the 4-bit layers with its own ``Linear4bit``.
    """
    bnb = import_bitsandbytes()
    from transformers.integrations import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    config = quantization_config(compute_dtype, quantize)
    originals = quantized_layers(model)
    replace_with_bnb_linear(model, modules_to_not_convert=get_keys_to_not_convert(model), quantization_config=config)
    for name, original in originals.items():
        layer = model.get_submodule(name)
        if not isinstance(layer, bnb.nn.Linear4bit):
            raise GaplanError(f"--quantize {quantize}: transformers did not quantize {name} ({type(original).__name__})")
        weight = original.weight.data.T.contiguous() if isinstance(original, Conv1D) else original.weight.data
        _fill_4bit(layer, original, weight, device)
    originals.clear()
    model.to(device)
    model.is_loaded_in_4bit = True
    model.config.quantization_config = config
    return model


def quantize_frozen_linears(model: nn.Module, device: torch.device, quantize: str = "4bit") -> nn.Module:
    """A ``module:function`` model with its frozen ``nn.Linear`` layers (:func:`quantized_layers`, ``own``) each a
    ``bnb.nn.Linear4bit`` on ``device`` that computes in the dtype its weight had (a bf16 model's products stay bf16,
    as a bf16-true run under Fabric's ``BitsandbytesPrecision`` computes them); the rest moved there, a bias that
    trains still training. A layer reached by two names is replaced at both."""
    bnb = import_bitsandbytes()
    names: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), []).append(name)
    for original in quantized_layers(model, own=True).values():
        layer = bnb.nn.Linear4bit(original.in_features, original.out_features, bias=original.bias is not None,
                                  compute_dtype=original.weight.dtype, compress_statistics=DOUBLE_QUANT[quantize],
                                  quant_type=QUANT_TYPE, quant_storage=torch.uint8, device="meta")
        _fill_4bit(layer, original, original.weight.data, device,
                   bias_trains=original.bias is not None and original.bias.requires_grad)
        for name in names[id(original)]:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
    model.to(device)
    model.is_loaded_in_4bit = True
    return model


def _fill_4bit(layer: nn.Module, original: nn.Module, weight: torch.Tensor, device: torch.device,
               bias_trains: bool = False) -> None:
    """``layer`` (a ``Linear4bit`` on meta) given ``original``'s weight, quantized as it moves to ``device``, and its
    bias; the full-precision copy goes now, not after the last layer."""
    bnb = import_bitsandbytes()
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, **layer.weight.__dict__).to(device)
    if original.bias is not None:
        layer.bias = nn.Parameter(original.bias.data.to(device), requires_grad=bias_trains)
    original.weight = original.bias = None


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict's trainable tensors (a QLoRA model's adapters): what a 4-bit model's checkpoint keeps, since
    torch's ``load_state_dict`` cannot restore bitsandbytes' quantization states and the base is rebuilt from its
    source."""
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    return {key: value for key, value in model.state_dict().items() if key in trainable}


def is_quantized(model: nn.Module) -> bool:
    """True if ``model`` (or the model a PeftModel or DDP wrapper holds) has a 4-bit base."""
    model = getattr(model, "module", model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_loaded_in_4bit", False))
