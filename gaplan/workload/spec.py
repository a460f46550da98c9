"""What is trained, as data: a serializable workload description, the presets, and where a model comes from. No torch.

Building it (model, optimizer, batches) is :mod:`gaplan.workload.build`'s job; this part is what plan files,
caches, the worker protocol and reports read and write.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from gaplan.core.checkpointing import OFF, Checkpointing, check_typed, parse_checkpointing
from gaplan.core.errors import GaplanError
from gaplan.core.lora_targets import LoraTargets, parse_lora_targets
from gaplan.core.loss_choice import LOSS_CHOICES, PLAIN, LossChoice, parse_loss
from gaplan.core.options import DATA, MEMORY, TRAINING, OptionError, option, positive_finite
from gaplan.core.outputs import absolute_if_here
from gaplan.data.tasks.component import LOSS_CHUNKED, TARGET_LEN
from gaplan.data.tasks.registry import known_task, task_component, task_names, tasks_taking
from gaplan.workload.presets import PRESETS

DTYPE_NAMES = ("fp32", "bf16", "fp16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes an element, by DTYPE_NAMES' name
QUANTIZE = ("4bit", "nf4")  # 4bit: nf4 with double quantization (QLoRA's); nf4: without it (LitGPT's bnb.nf4)
QUANTIZE_APPLIES = "`--lora` (QLoRA), or a `module:function` model (its frozen `nn.Linear` layers)"
ATTENTIONS = ("eager", "sdpa")  # transformers' attn_implementation: None keeps the model's default (sdpa where it has it)
INITS = ("auto", "pretrained", "random")  # auto: the folder's weights when it has them, else a random init
# The optimizers gaplan builds (gaplan.workload.optimizers), the choices of every command's --optimizer.
OPTIMIZERS = ("adamw", "adamw-fused", "adamw-forloop", "adamw-8bit", "paged-adamw-8bit", "adafactor", "lion", "sgd")
# torch's AdamW by its implementation (one update rule, the same states): its default (foreach on CUDA parameters,
# for-loop on the CPU), fused (one kernel per step, no temporaries), for-loop (one parameter at a time).
ADAMW_IMPLEMENTATIONS = ("adamw", "adamw-fused", "adamw-forloop")
# What --parallel fsdp trains with: torch's AdamW in each kernel and SGD step FSDP2's DTensor shards; the others keep
# states FSDP2 does not shard.
SHARDED_OPTIMIZERS = (*ADAMW_IMPLEMENTATIONS, "sgd")

# The fields that set how a step is split or run, not the step: memory and speed, not the math (both losses are
# token-exact), so a resumed run may change them (and re-plans). docs/resume.md has the table.
SPLIT_ONLY_FIELDS = ("grad_checkpointing", "attention", "parallel", "cpu_offload", "grad_sync", "compile", "loss",
                     "offload_activations")
DEFAULT_MODEL = "tiny-gpt2"
FSDP = "`--parallel fsdp`"  # where the sharded layout's options apply

# The learning rate when none is given: AdamW's usual 1e-3 learns in a few steps (so do its 8-bit forms and Adafactor
# at a fixed rate); SGD takes a cautious 1e-4, and so does Lion, whose sign update wants a rate 3-10x below AdamW's.
DEFAULT_LR = {"adamw": 1e-3, "adamw-fused": 1e-3, "adamw-forloop": 1e-3,
              "adamw-8bit": 1e-3, "paged-adamw-8bit": 1e-3, "adafactor": 1e-3, "lion": 1e-4,
              "sgd": 1e-4}
PARALLEL_LAYOUTS = ("ddp", "fsdp")
GRAD_SYNCS = ("last", "every")


def model_path(model: str) -> str:
    """``--model`` as a run records it: a model folder here made absolute, so a run's ``--resume`` and
    ``config.toml`` name it from any directory; a preset's name stays its own (a folder of that name or not)."""
    return model if not isinstance(model, str) or model in PRESETS else absolute_if_here(model)


@dataclass(frozen=True)
class WorkloadSpec:
    """A serializable description of a workload; built into a :class:`Workload` by :func:`build_workload`."""

    CONFIG_TABLE: ClassVar[str] = "workload"  # its options' table in a config file: [COMMAND.workload]

    # A field with help is its command-line option (gaplan.cli.field_options). probe_key=False: no effect on memory,
    # so a cached probe of another value still holds (same_workload).
    model: str = option(DEFAULT_MODEL, section=DATA, parse=model_path, metavar="NAME|DIR|MODULE:FUNC", help=(
        "A preset, a Hugging Face model directory or cached id, or module:function. Presets: tiny-gpt2 (default), "
        "small-gpt2, tiny-llama, tiny-bert-mlm, tiny-bert-cls, tiny-t5; and shapes to estimate and plan for: "
        "llama-2-7b, llama-3-8b, llama-2-13b, llama-2-70b."))
    task: str | None = option(None, section=DATA, metavar="TASK", help=(
        "causal-lm, masked-lm, classification or seq2seq-lm (default: the model's own; an encoder-decoder such as "
        "T5 or BART is seq2seq-lm)."))
    seq_len: int | None = option(None, section=DATA, help=(
        "Sequence length of every sample; for seq2seq-lm the source (encoder) length (default: the model's)."))
    dtype: str = option("fp32", section=MEMORY, metavar="|".join(DTYPE_NAMES), help=(
        "Compute dtype (autocast; weights keep --weights-dtype)."))
    optimizer: str = option("adamw", section=TRAINING, metavar="|".join(OPTIMIZERS), help=(
        "adamw (torch's default kernel), adamw-fused, adamw-forloop, 8-bit forms (bitsandbytes), adafactor, lion "
        "or sgd."))
    lr: float | None = option(None, section=TRAINING, probe_key=False, help=(  # None: DEFAULT_LR (learning_rate)
        "Learning rate (default: 1e-3 for adamw, its 8-bit forms and adafactor; 1e-4 for lion and sgd)."))
    # Which blocks recompute their activations in backward. Saved as a plan file has always held it (False, True or
    # "every:K" / "layers:N"): to_dict writes that form and from_dict reads it, the one place it is parsed.
    grad_checkpointing: Checkpointing = OFF
    # Added later: a plan file or worker message without these keys gets the defaults (WorkloadSpec.from_dict).
    init: str = option("auto", section=DATA, choices=INITS, probe_key=False, help=(
        "A model folder's weights: auto (its weights when it has them, else a random init), pretrained (require "
        "them) or random (a fresh init from the config)."))
    weights_dtype: str = option("fp32", section=DATA, choices=DTYPE_NAMES, help=(
        "Dtype of the master weights (--dtype is the autocast compute dtype)."))
    trust_remote_code: bool = option(False, section=DATA, probe_key=False, help=(
        "Let transformers run the model folder's own code."))
    parallel: str = option("ddp", section=MEMORY, choices=PARALLEL_LAYOUTS, help=(
        "Over several ranks: ddp (replicated) or fsdp (FSDP2, each block sharded over the ranks)."))
    cpu_offload: bool = option(False, section=MEMORY, applies=FSDP, help=(
        "With --parallel fsdp: keep parameters, gradients and optimizer states on the CPU."))
    grad_sync: str = option("last", section=MEMORY, choices=GRAD_SYNCS, applies=FSDP + " (`every`; `last` is DDP's too)",
                            help=(
        "With --parallel fsdp: reduce-scatter gradients on the last micro-step only, or on every one (gradients "
        "stay sharded between micro-steps: less memory, more traffic)."))
    # LoRA (peft): the base frozen in weights_dtype, adapters on lora_targets trained.
    lora: bool = option(False, section=DATA, help=(
        "Train LoRA adapters (peft) on a frozen base: only the adapters have gradients and optimizer states."))
    lora_r: int = option(16, section=DATA, applies="`--lora` (as `--lora-alpha`, `--lora-dropout`, `--lora-targets`)",
                         help="LoRA rank.")
    lora_alpha: float = option(32.0, section=DATA, help="LoRA scaling alpha.")
    lora_dropout: float = option(0.05, section=DATA, help="Dropout on the adapters' input.")
    lora_targets: LoraTargets | None = option(None, section=DATA, parse=parse_lora_targets, metavar="all-linear|M1,M2",
                                              help=(
        "Modules that get adapters: all-linear, or names such as q_proj,v_proj (default: peft's for the "
        "architecture, e.g. c_attn for GPT-2, q_proj,v_proj for Llama)."))
    quantize: str | None = option(None, section=DATA, choices=QUANTIZE, applies=QUANTIZE_APPLIES, help=(
        "QLoRA: the frozen base in 4-bit nf4, 4bit with double quantization (QLoRA's), nf4 without it (LitGPT's "
        "bnb.nf4); of a module:function model, its frozen nn.Linear layers; bitsandbytes >= 0.46, which runs it on "
        "CUDA and on the CPU."))
    target_len: int | None = option(None, section=DATA, applies="task `seq2seq-lm`", help=(
        "seq2seq-lm: the target (decoder) length (default: half the source length)."))
    attention: str | None = option(None, section=DATA, choices=ATTENTIONS, help=(
        "transformers' attention implementation where the model has both (default: the model's, sdpa where it has "
        "it): eager keeps the seq x seq probabilities for backward, sdpa does not."))
    # gaplan.workload.chunked_loss
    loss: LossChoice = option(PLAIN, section=MEMORY, parse=parse_loss, metavar=LOSS_CHOICES,
                       applies="`chunked`: tasks `causal-lm` and `seq2seq-lm` (`plain` everywhere)", help=(
        "chunked: the LM head and cross-entropy TOKENS positions at a time, recomputed in backward, so the [B, T, V] "
        "logits never exist whole (causal-lm and seq2seq-lm; default TOKENS: 16 MiB of fp32 logits)."))
    # Workload.forward_context: torch's save_on_cpu around each forward (gaplan.estimate.offload models it)
    offload_activations: bool = option(False, section=MEMORY, applies="a CUDA device", help=(
        "CUDA: move every tensor saved for backward to pinned host memory in forward and back in backward (torch's "
        "save_on_cpu): the device holds about one layer's activations at a time; the copies cross PCIe twice."))
    # gaplan.workload.compile: changes what is saved for backward, so it is a probe key
    compile: bool = option(False, section=MEMORY, help=(
        "torch.compile the model (inductor), so the probe measures the compiled step (the estimate traces it as "
        "inductor partitions it in one process, over several ranks the eager model; on the CPU it needs a C++ "
        "compiler)."))

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", model_path(self.model))  # the Python API's edge, a saved workload's text
        check_typed(self.grad_checkpointing)  # a typed field: text is parsed at the edge
        if not isinstance(self.loss, LossChoice):  # the Python API's edge, and a saved workload's text (from_dict)
            object.__setattr__(self, "loss", parse_loss(self.loss))
        if not isinstance(self.lora_targets, LoraTargets):  # the Python API's edge, a saved workload's text
            object.__setattr__(self, "lora_targets", parse_lora_targets(self.lora_targets))

    @property
    def learning_rate(self) -> float:
        """The learning rate to train with: the one given, else the optimizer's default."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_dict(self) -> dict:
        """The spec as plan files, caches and worker messages hold it (JSON); :meth:`from_dict` reads it back."""
        return {**asdict(self), "grad_checkpointing": self.grad_checkpointing.spec_value(), "loss": str(self.loss),
                "lora_targets": None if self.lora_targets is None else str(self.lora_targets)}

    @classmethod
    def from_dict(cls, data: dict) -> WorkloadSpec:
        """A spec from :meth:`to_dict`'s form, as any gaplan wrote it (a key added later takes its default)."""
        return cls(**{**data, "grad_checkpointing": parse_checkpointing(data.get("grad_checkpointing"))})

    @classmethod
    def probe_key_fields(cls) -> tuple[str, ...]:
        """The fields a probe depends on: two specs equal in these share B*."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("probe_key", True))

    def check_device(self, device: str) -> WorkloadSpec:
        """``self``, or a one-line error for what ``device`` cannot run (``device`` resolved: ``cpu``, ``cuda:0``)."""
        if self.quantize:
            _check_bitsandbytes(str(device))
        if self.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
            _check_optimizer_package(self.optimizer, str(device))
        if self.compile:
            from gaplan.workload.compile import check_compiler

            check_compiler(str(device))
        if self.cpu_offload and str(device).startswith("cpu"):
            raise OptionError("cpu_offload moves FSDP's shards and optimizer states off a GPU to the CPU; on "
                              "device cpu they are on the CPU already: leave it out", "cpu_offload", "device")
        return self.check_offload(device)

    def check_offload(self, device: str) -> WorkloadSpec:
        """``self``, or the one-line refusal of ``offload_activations`` on a CPU (whose host memory is its device's)."""
        if self.offload_activations and str(device).strip().lower().startswith("cpu"):
            raise OptionError("offload_activations moves the tensors saved for backward off a GPU to the host; on "
                              "device cpu they are in host memory already: leave it out", "offload_activations",
                              "device")
        return self

    def validate(self) -> WorkloadSpec:
        """Check what can be checked without building anything."""
        if not isinstance(self.model, str):  # your own nn.Module: probe_loop, or a module:function that returns it
            raise OptionError(f"model must be a preset name, a model folder, a Hugging Face id or 'module:function' "
                              f"(got a {type(self.model).__name__}): for your own model object use gaplan.probe_loop, "
                              "or a module:function returning gaplan.CustomWorkload", "model")
        if self.task is not None and self.task not in task_names():
            raise GaplanError(f"unknown task {self.task!r}; choose one of {', '.join(task_names())}")
        if self.dtype not in DTYPE_NAMES:
            raise GaplanError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPE_NAMES)}")
        if self.init not in INITS:
            raise OptionError(f"unknown init {self.init!r}; choose one of {', '.join(INITS)}", "init")
        if self.weights_dtype not in DTYPE_NAMES:
            raise GaplanError(f"unknown weights dtype {self.weights_dtype!r}; choose one of {', '.join(DTYPE_NAMES)}")
        if self.weights_dtype == "fp16" and self.dtype == "fp16":
            raise OptionError("weights_dtype fp16 cannot train with dtype fp16: the loss scaler needs fp32 or "
                              "bf16 master weights (fp16 gradients cannot be unscaled)", "weights_dtype", "dtype")
        if self.parallel not in PARALLEL_LAYOUTS:
            raise OptionError(f"unknown parallel {self.parallel!r}; choose one of {', '.join(PARALLEL_LAYOUTS)}", "parallel")
        if self.grad_sync not in GRAD_SYNCS:
            raise OptionError(f"unknown grad_sync {self.grad_sync!r}; choose one of {', '.join(GRAD_SYNCS)}", "grad_sync")
        if self.parallel != "fsdp" and self.cpu_offload:
            raise OptionError("cpu_offload needs parallel fsdp (it offloads FSDP's sharded parameters and "
                              "optimizer states)", "cpu_offload", "parallel")
        if self.parallel != "fsdp" and self.grad_sync != "last":
            raise OptionError("grad_sync every needs parallel fsdp (DDP syncs on the last micro-step)", "grad_sync", "parallel")
        if not isinstance(self.trust_remote_code, bool):
            raise GaplanError(f"trust_remote_code must be true or false (got {self.trust_remote_code!r})")
        kind = model_source_kind(self.model)
        self._validate_lora(kind)
        if self.optimizer not in OPTIMIZERS:
            raise OptionError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}",
                              "optimizer")
        if self.parallel == "fsdp" and self.optimizer not in SHARDED_OPTIMIZERS:
            raise OptionError(f"optimizer {self.optimizer} with parallel fsdp is not supported (its states are not "
                              f"FSDP2's sharded tensors): use {' or '.join(SHARDED_OPTIMIZERS)}, or parallel ddp",
                              "optimizer", "parallel")
        self._validate_loss(kind)
        if not isinstance(self.compile, bool):
            raise OptionError(f"compile must be true or false (got {self.compile!r})", "compile")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or isinstance(self.seq_len, bool)
                                         or self.seq_len < 2):
            raise OptionError(f"seq_len must be an integer of at least 2 (got {self.seq_len!r})", "seq_len")
        if self.attention is not None and self.attention not in ATTENTIONS:
            raise OptionError(f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTIONS)}", "attention")
        if self.target_len is not None and (not isinstance(self.target_len, int) or isinstance(self.target_len, bool)
                                            or self.target_len < 1):
            raise OptionError(f"target_len must be a positive integer (got {self.target_len!r})", "target_len")
        task = self.task or (PRESETS[self.model][2] if self.model in PRESETS else None)
        if task is not None:  # a folder's task is known once its config is read (gaplan.workload.seq2seq)
            self.check_target_len(task)
        if self.lr is not None and not positive_finite(self.lr):
            raise OptionError(f"lr must be a positive number (got {self.lr})", "lr")
        if kind == "function" and self.task is not None:
            raise OptionError("task does not apply to a module:function model (its function defines the loss)", "task")
        if kind in ("function", "preset") and self.init == "pretrained":
            raise OptionError(f"init pretrained needs a model folder with weights; {self.model} is a "
                              f"{'built-in preset' if kind == 'preset' else 'module:function model'} without any", "init")
        if kind == "function" and self.attention is not None:
            raise OptionError("attention does not apply to a module:function model (its function builds it)", "attention")
        if kind == "function" and self.weights_dtype != "fp32":
            raise OptionError("weights_dtype does not apply to a module:function model (its function builds it)", "weights_dtype")
        return self

    @property
    def chunk_tokens(self) -> int | None:
        """``loss chunked:TOKENS``'s positions a chunk, 0 for ``chunked`` (the workload's default), None for plain."""
        return self.loss.chunk_tokens

    def _validate_loss(self, kind: str) -> None:
        if not self.loss.chunked:
            return
        if kind == "function":
            raise OptionError("loss chunked does not apply to a module:function model (its function defines the loss)",
                              "loss")
        if self.parallel == "fsdp":
            raise OptionError("loss chunked with parallel fsdp is not supported (the head's sharded weight would be "
                              "used outside FSDP's forward): use loss plain, or parallel ddp", "loss", "parallel")
        task = self.task or (PRESETS[self.model][2] if self.model in PRESETS else None)
        if task is not None:  # a folder's task is known once its config is read (gaplan.workload.build)
            self.check_loss(task)

    def check_loss(self, task: str) -> None:
        """A one-line error for a chunked loss on a model that trains as ``task``, not a language model's head."""
        if self.chunk_tokens is not None and LOSS_CHUNKED not in task_component(task).options:
            raise OptionError(f"loss chunked applies to {' and '.join(tasks_taking(LOSS_CHUNKED))} models (a language "
                              f"model's head over the vocabulary); {self.model} trains as {task}: use loss plain", "loss")

    def check_target_len(self, task: str) -> None:
        """A one-line error for ``--target-len`` on a model that trains as ``task``, not seq2seq-lm."""
        if self.target_len is not None and TARGET_LEN not in task_component(task).options:
            raise OptionError(f"target_len applies to {' and '.join(tasks_taking(TARGET_LEN))} models; {self.model} "
                              f"trains as {task}", "target_len")

    def _validate_lora(self, kind: str) -> None:
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise OptionError(f"unknown quantize {self.quantize!r}; choose {', '.join(QUANTIZE)}", "quantize")
        if not self.lora:
            # The adapters' settings without adapters would train a full fine-tune and ignore them.
            defaults = {f.name: f.default for f in fields(self) if f.name in LORA_SETTINGS}
            changed = [name for name in LORA_SETTINGS if getattr(self, name) != defaults[name]]
            if changed:
                raise OptionError(f"{', '.join(changed)} {'sets' if len(changed) == 1 else 'set'} LoRA adapters, and "
                                  "lora is off: add lora, or leave it out", *changed, "lora")
            if self.quantize and kind != "function":  # a module:function model's own adapters train its base
                raise OptionError(f"quantize {self.quantize} is QLoRA: it quantizes the frozen base under lora adapters; "
                                  "add lora (or give a module:function model, whose frozen linear layers it quantizes)",
                                  "quantize", "lora")
        if self.quantize and self.parallel == "fsdp":
            # FSDP+QLoRA as published (PEFT's guide, Answer.AI's) is FSDP1's flat parameters over 4-bit weights stored
            # as bf16 (bnb_4bit_quant_storage). gaplan shards with FSDP2, whose fully_shard makes each Params4bit a
            # plain DTensor shard and drops its quant_state: a forward then fails (measured on the CPU, bitsandbytes
            # 0.50, torch 2.13; tests/estimate/test_lora_estimate.py) or, on CUDA, computes wrong values
            # (bitsandbytes#1945, accelerate#3874, both open).
            raise OptionError(f"quantize {self.quantize} with parallel fsdp is not supported: gaplan shards with FSDP2, whose "
                              "fully_shard turns bitsandbytes' 4-bit weights into plain shards without their "
                              "quantization state (the published FSDP+QLoRA recipe is FSDP1's); use QLoRA on one card, "
                              "or LoRA with fsdp", "quantize", "parallel")
        if not self.lora:
            return
        if kind == "function":
            raise OptionError("lora does not apply to a module:function model (its function builds it): wrap it "
                              "with peft.get_peft_model there", "lora")
        if not isinstance(self.lora_r, int) or isinstance(self.lora_r, bool) or self.lora_r < 1:
            raise OptionError(f"lora_r must be a positive integer (got {self.lora_r})", "lora_r")
        if not positive_finite(self.lora_alpha):
            raise OptionError(f"lora_alpha must be a positive number (got {self.lora_alpha})", "lora_alpha")
        if not isinstance(self.lora_dropout, (int, float)) or isinstance(self.lora_dropout, bool) or \
                not 0 <= self.lora_dropout < 1:
            raise OptionError(f"lora_dropout must be in [0, 1) (got {self.lora_dropout!r})", "lora_dropout")

    @property
    def lora_target_modules(self) -> str | list[str] | None:
        """peft's ``target_modules``: None (its default for the architecture), ``"all-linear"``, or the names."""
        return None if self.lora_targets is None else self.lora_targets.target_modules


def lengths_text(task: str | None, seq_len: int | None, target_len: int | None) -> str:
    """``seq len 128``, or for seq2seq-lm ``source 128, target 64`` (the target's default: half the source)."""
    component = known_task(task)
    if component is not None and component.has_target and seq_len:
        return f"source {seq_len}, target {target_len or default_target_len(seq_len)}"
    return f"seq len {seq_len}"


def default_target_len(seq_len: int) -> int:
    """A seq2seq-lm target's length when none is given: half the source's."""
    return max(1, seq_len // 2)


def model_source_kind(model: str) -> str:
    """``preset``, ``directory``, ``function`` or ``hub-cache``, decided from the string alone."""
    if model in PRESETS:
        return "preset"
    if os.path.isdir(model):
        return "directory"
    if ":" in model and not model.startswith((".", "/")):
        return "function"
    return "hub-cache"


BITSANDBYTES_CPU = (0, 46)  # the first bitsandbytes release whose nf4 quantization and matmul run on the CPU
NEEDS_BITSANDBYTES = "--quantize 4bit needs bitsandbytes: pip install 'gaplan[qlora]'"


LORA_SETTINGS = ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")  # what only LoRA reads


PAGED_ON_CPU = ("optimizer paged-adamw-8bit pages its states through CUDA unified memory, which the CPU does not have "
                "(bitsandbytes would run it unpaged): use optimizer adamw-8bit on the CPU, or a CUDA device (gaplan "
                "estimate plans it without one)")


def _check_optimizer_package(optimizer: str, device: str) -> None:
    """A one-line error unless bitsandbytes is installed, and the optimizer can run on ``device``."""
    from importlib import util

    if util.find_spec("bitsandbytes") is None:
        raise OptionError(f"optimizer {optimizer} needs bitsandbytes: pip install bitsandbytes", "optimizer")
    if optimizer == "paged-adamw-8bit" and device.startswith("cpu"):
        raise OptionError(PAGED_ON_CPU, "optimizer", "device")


def _check_bitsandbytes(device: str) -> None:
    """A one-line error unless bitsandbytes is installed, and new enough for a CPU ``device``."""
    from importlib import metadata

    try:
        version = metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        raise GaplanError(NEEDS_BITSANDBYTES) from None
    release = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if device.startswith("cpu") and release < BITSANDBYTES_CPU:
        raise GaplanError(f"--quantize 4bit on the CPU needs bitsandbytes >= {'.'.join(map(str, BITSANDBYTES_CPU))} "
                          f"(installed: {version}, whose nf4 runs on CUDA only): pip install 'gaplan[qlora]'")
