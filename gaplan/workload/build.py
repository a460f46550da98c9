"""What is trained: a model, its task, a batch maker and an optimizer.

A model comes from one of three sources:

* a built-in preset, made from a transformers config (no download);
* a Hugging Face model directory, or a model id already in the local HF cache: its own weights
  (``from_pretrained``, straight onto the training device) when it has them and ``spec.init`` allows,
  else a random init from its config (built directly on the device). The meta device and the probe's
  trials (``load_weights=False``) never read weights: weights don't change memory;
* ``module:function`` returning a :class:`CustomWorkload` (or a tuple
  ``(model, make_batch[, loss])``), for any model, LM or not.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gaplan.core.errors import GaplanError
from gaplan.core.tasks import CAUSAL_LM, CUSTOM
from gaplan.data.tasks.infer import task_of_config
from gaplan.data.tasks.registry import task_component
from gaplan.workload.checkpointing import apply_checkpointing
from gaplan.workload.compile import compile_model
from gaplan.workload.function_model import CustomWorkload, made_by_function
from gaplan.workload.loss import summed_token_loss
from gaplan.workload.model_io import load_pretrained, quiet_transformers, weights_files
from gaplan.workload.optimizers import check_optimizer_device, make_optimizer, optimizer_state_bytes
from gaplan.workload.seq2seq import target_length
from gaplan.workload.spec import DEFAULT_MODEL, PRESETS, WorkloadSpec, model_source_kind

# re-exported: the spec is data; the optimizer's builder and state count live in gaplan.workload.optimizers, what a
# module:function model returns in gaplan.workload.function_model
__all__ = ["DEFAULT_MODEL", "PRESETS", "CustomWorkload", "WorkloadSpec", "make_optimizer", "model_source_kind",
           "optimizer_state_bytes"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # the names of DTYPE_NAMES
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Workload:
    """A built workload: model and optimizer on a device, a batch maker and a loss."""

    spec: WorkloadSpec
    model: nn.Module
    optimizer: torch.optim.Optimizer
    task: str
    seq_len: int | None
    make_batch: Callable[[int], dict[str, torch.Tensor]]
    raw_loss: Callable[[nn.Module, Mapping[str, Any]], torch.Tensor]  # (model or its DDP wrapper, batch)
    loss_is_scaled_for_ga: bool | None  # None: raw_loss is a sum over targets
    device: torch.device
    vocab_size: int | None = None
    num_labels: int | None = None
    info: dict = field(default_factory=dict)
    draws: str | int | None = None  # a module:function workload's declared drawing (CustomWorkload.draws)

    @property
    def param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def static_bytes(self) -> int:
        """Weights + gradients + optimizer states: what must fit before any activation."""
        return static_bytes(self.model, self.spec.optimizer)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The mixed-precision context of the compute dtype (the weights keep ``spec.weights_dtype``)."""
        if self.spec.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=DTYPES[self.spec.dtype])

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """What each micro-step's forward runs under: :meth:`autocast`, and with ``offload_activations`` on a GPU
        torch's ``save_on_cpu`` (each tensor saved for backward goes to pinned host memory and comes back when
        backward needs it; the pack and unpack pair is kept with each saved tensor, so backward needs no context)."""
        offload = self.spec.offload_activations and self.device.type == "cuda"
        with self.autocast(), torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else contextlib.nullcontext():
            yield


def static_bytes(model: nn.Module, optimizer: str) -> int:
    """Bytes of weights, gradients and optimizer states (:func:`optimizer_state_bytes`)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + grads + optimizer_state_bytes(model, optimizer)


def load_model_config(spec: WorkloadSpec) -> tuple[Any, str, int]:
    """The transformers config, task and default sequence length of a preset, directory or cached id."""
    import transformers

    kind = model_source_kind(spec.model)
    if kind == "preset":
        config_class, kwargs, task, seq_len, _ = PRESETS[spec.model]
        config = getattr(transformers, config_class)(**kwargs)
        return config, spec.task or task, seq_len
    if kind == "directory" and not os.path.isfile(os.path.join(spec.model, "config.json")):
        raise GaplanError(f"{spec.model} is a directory without a config.json: not a Hugging Face model")
    try:
        with quiet_transformers():
            config = transformers.AutoConfig.from_pretrained(spec.model, local_files_only=True,
                                                             trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError) as exc:
        if kind == "directory":
            raise GaplanError(f"cannot read the model config in {spec.model}: {str(exc).splitlines()[0]}") from None
        known = ", ".join(PRESETS)
        raise GaplanError(f"unknown model {spec.model!r}: not a preset ({known}), not a directory, "
                          "not in the local Hugging Face cache, and not module:function") from None
    task = spec.task or task_of_config(config, default=CAUSAL_LM)
    return config, task, 512


def model_shape(spec: WorkloadSpec) -> tuple[str, int, int, int]:
    """``(task, seq_len, vocab_size, num_labels)`` from the config alone, as :func:`build_workload` decides them."""
    config, task, default_seq_len = load_model_config(spec)
    seq_len = spec.seq_len or min(default_seq_len, _max_positions(config) or default_seq_len)
    return task, seq_len, int(config.vocab_size), int(getattr(config, "num_labels", 2))


def _max_positions(config: Any) -> int | None:
    for attr in ("n_positions", "max_position_embeddings"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    return None


def build_workload(spec: WorkloadSpec, device: str | torch.device = "cpu", seed: int = 0,
                   load_weights: bool = True, model_on_meta: bool = False) -> Workload:
    """Build the model, optimizer and batch maker of ``spec`` on ``device``.

    A model folder with weights starts from them (``spec.init`` auto or pretrained), loaded straight
    onto ``device``. On the meta device, or with ``load_weights=False`` (the probe's trials: weights
    don't change memory), the model is built from its config directly on ``device`` and no weights
    file is read; ``spec.init="pretrained"`` still checks that the folder has weights.
    ``workload.info["weights"]`` says which: ``"pretrained"`` (with ``info["weights_path"]``) or ``"random"``.
    ``model_on_meta``: only the model goes on the meta device (batches still on ``device``), for a caller that
    shards it and fills it in place (:func:`gaplan.parallel.build.build_sharded_workload`).
    """
    spec.validate()
    device = torch.device(device)
    if device.type != "meta":
        check_optimizer_device(spec.optimizer, device)
    spec.check_offload(device.type)  # --device auto resolves here (a fake workload is built on meta)
    model_device = torch.device("meta") if model_on_meta else device
    torch.manual_seed(seed)
    if model_source_kind(spec.model) == "function":
        return _build_custom(spec, device)
    config, task, default_seq_len = load_model_config(spec)
    spec.check_loss(task)
    seq_len = spec.seq_len or min(default_seq_len, _max_positions(config) or default_seq_len)
    max_positions = _max_positions(config)
    target_len = target_length(spec, task, seq_len)
    for name, length in (("--seq-len", seq_len), ("--target-len", target_len)):
        if max_positions is not None and length is not None and length > max_positions:
            raise GaplanError(f"{name} {length} is longer than the model's {max_positions} positions")
    use_cache = getattr(config, "use_cache", True)
    config.use_cache = False  # HF models return a KV cache in training otherwise (save_model restores it)
    folder = _weights_folder(spec)
    if spec.init == "pretrained" and folder is None:
        raise GaplanError(f"--init pretrained: {spec.model} has no weights (no model.safetensors, pytorch_model.bin "
                          "or sharded index); use --init random to train it from a random init")
    pretrained = folder is not None and spec.init != "random" and load_weights and model_device.type != "meta"
    # QLoRA: built in full precision on the CPU, then each linear layer quantized onto the device (the meta device,
    # for the estimate, keeps the traced dtype: gaplan.estimate.quantized accounts for the 4 bits).
    quantize = bool(spec.quantize) and model_device.type != "meta"
    build_device = torch.device("cpu") if quantize else model_device
    if pretrained:
        model = load_pretrained(folder, task_component(task).auto_class, config, DTYPES[spec.weights_dtype], build_device,
                                spec.trust_remote_code, spec.attention)
    else:
        model = _from_config(spec, config, task, build_device)
    if quantize:
        from gaplan.workload.quantize import quantize_base

        model = quantize_base(model, DTYPES[spec.dtype], model_device, spec.quantize)
    apply_checkpointing(model, spec.grad_checkpointing, spec.model)
    if spec.lora:
        from gaplan.workload.lora import apply_lora

        model = apply_lora(model, spec, task)
    model.to(model_device).train()
    if spec.compile:
        compile_model(model, model_device)
    vocab_size = int(config.vocab_size)
    num_labels = int(getattr(config, "num_labels", 2))
    make_batch = _lm_batch_maker(task, seq_len, vocab_size, num_labels, device, target_len)

    component = task_component(task)
    chunk_tokens = spec.chunk_tokens
    if chunk_tokens is not None:
        from gaplan.workload.chunked_loss import chunked_token_loss, default_chunk_tokens, output_head

        output_head(model)  # a model whose head cannot be run apart is refused now, not at its first step
        chunk_tokens = chunk_tokens or default_chunk_tokens(vocab_size)

    def raw_loss(module: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k in _MODEL_INPUTS}
        # The labels stay out of the call (the model would compute a mean loss of its own); the task adds what else
        # the call needs (seq2seq-lm: the decoder's inputs).
        component.model_inputs(module, batch, inputs)
        if chunk_tokens is not None:
            return chunked_token_loss(module, inputs, batch, task, chunk_tokens)
        logits = module(**inputs).logits
        return summed_token_loss(logits, batch, task)

    info = {"model_type": getattr(config, "model_type", "?"), "weights": "pretrained" if pretrained else "random",
            "weights_path": folder if pretrained else None, "use_cache": use_cache, "target_len": target_len,
            "loss_chunk_tokens": chunk_tokens}
    return Workload(spec, model, make_optimizer(model, spec.optimizer, spec.learning_rate), task, seq_len, make_batch,
                    raw_loss, None, device, vocab_size, num_labels, info=info)


def full_precision_twin(workload: Workload, seed: int = 0) -> Workload:
    """A QLoRA workload's model with its base in ``--weights-dtype`` again, on the CPU, carrying the trained adapters.

    The base comes from the same source as the 4-bit one (the folder's weights, or the same seed's random init), so
    ``--merge`` adds the adapters to the full-precision weights, rather than to 4-bit ones whose sum would be
    rounded to 4 bits again.
    """
    import dataclasses

    from gaplan.workload.quantize import trainable_state

    twin = build_workload(dataclasses.replace(workload.spec, quantize=None), "cpu", seed=seed)
    adapters = trainable_state(getattr(workload.model, "module", workload.model))
    unexpected = twin.model.load_state_dict({k: v.to("cpu") for k, v in adapters.items()}, strict=False).unexpected_keys
    if unexpected:
        raise GaplanError(f"--merge: the adapters do not fit the full-precision base ({unexpected[0]})")
    return twin


def load_model_code(spec: WorkloadSpec) -> Workload | None:
    """Build ``spec`` on the meta device (nothing allocated): imports the model's code, once, and lets the libraries
    make their one-time allocations.

    A CPU budget (RLIMIT_DATA over the process's data size when it is set) taken after this counts what training
    holds, not the libraries: the probe's worker does it before its trials fork, and a training run under
    ``--enforce-memory-limit`` must do it before its budget too, or it has less room than the trials had (about
    90 MiB less for tiny-gpt2: transformers' GPT-2 modules). A sharded workload imports FSDP2 and the distributed
    checkpoint's state-dict API (which fills the shards from rank 0) here too. None for a ``module:function``
    model, which may not build on meta (its code is imported by then).
    """
    if spec.parallel == "fsdp":
        # FSDP2 and DTensor: ~40 MiB of library, not of training. The checkpoint's 70-odd modules are ~2.4 MiB
        # more: transformers 5.24 imported them with itself, 5.25 no longer does, and imported in each rank's
        # trial they read as 2.4 MiB of training memory (the FSDP estimate fell to -3.2% at micro-batch 4).
        import torch.distributed.checkpoint.state_dict  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
    if model_source_kind(spec.model) == "function":
        return None
    return build_workload(spec, "meta")


def _from_config(spec: WorkloadSpec, config: Any, task: str, device: torch.device) -> nn.Module:
    """A random init from the config, built in place on ``device`` (on meta nothing is allocated).

    Built under ``torch.device(device)``, so a 7B model probed on a GPU never exists on the CPU first.
    The weights get ``spec.weights_dtype`` whatever the config's dtype says (Llama-2's says float16):
    ``spec.dtype`` is autocast.
    """
    import transformers

    auto = getattr(transformers, task_component(task).auto_class)
    chosen = {"attn_implementation": spec.attention} if spec.attention else {}
    try:
        with torch.device(device), quiet_transformers():
            return auto.from_config(config, dtype=DTYPES[spec.weights_dtype], trust_remote_code=spec.trust_remote_code,
                                    **chosen)
    except ValueError as exc:
        raise GaplanError(f"{spec.model} cannot be built for task {task}: {str(exc).splitlines()[0]}") from None


def _weights_folder(spec: WorkloadSpec) -> str | None:
    """The folder holding ``spec.model``'s weights: the model directory, or a cached id's snapshot; None if none."""
    kind = model_source_kind(spec.model)
    folder = spec.model if kind == "directory" else _cached_snapshot(spec.model) if kind == "hub-cache" else None
    return folder if folder is not None and weights_files(folder) else None


def _cached_snapshot(model_id: str) -> str | None:
    """The local snapshot folder of a model id in the Hugging Face cache (no network), or None."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, not a valid id, hub library missing: no weights to load
        return None


def _lm_batch_maker(task: str, seq_len: int, vocab_size: int, num_labels: int, device: torch.device,
                    target_len: int | None = None) -> Callable[[int], dict[str, torch.Tensor]]:
    """Full-length random batches: the longest a batch can be, so the probe sees the worst case (for seq2seq-lm,
    sources of ``seq_len`` and targets of ``target_len`` tokens)."""
    generator = torch.Generator().manual_seed(1234)
    component = task_component(task)

    def make_batch(size: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab_size, (size, seq_len), generator=generator)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        batch["labels"] = component.fake_labels(ids, generator, vocab_size, num_labels, target_len)
        return {k: v.to(device) for k, v in batch.items()}

    return make_batch


def _build_custom(spec: WorkloadSpec, device: torch.device) -> Workload:
    made = made_by_function(spec.model)
    apply_checkpointing(made.model, spec.grad_checkpointing, spec.model)
    model = made.model
    if spec.quantize and device.type != "meta":  # on meta (the estimate's trace) gaplan.estimate.quantized counts it
        from gaplan.workload.quantize import quantize_frozen_linears

        model = quantize_frozen_linears(model, device, spec.quantize)
    model = model.to(device).train()
    if spec.compile:
        compile_model(model, device)
    user_loss = made.loss
    workload_batch = made.make_batch

    def make_batch(size: int) -> dict[str, torch.Tensor]:
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in workload_batch(size).items()}

    def raw_loss(module: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        if user_loss is not None:
            return user_loss(module, batch)
        inputs = {k: v for k, v in batch.items() if k != "num_items_in_batch"}
        out = module(**inputs)
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, Mapping):
            loss = out.get("loss")
        if loss is None and isinstance(out, torch.Tensor) and out.dim() == 0:
            loss = out
        if loss is None:
            raise GaplanError(f"{spec.model}: the model returned no loss; give CustomWorkload a loss function")
        return loss

    return Workload(spec, model, make_optimizer(model, spec.optimizer, spec.learning_rate), CUSTOM, spec.seq_len,
                    make_batch, raw_loss, made.loss_is_scaled_for_ga, device,
                    info={"model_type": type(model).__name__}, draws=made.draws)
