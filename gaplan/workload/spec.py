"""What is trained, as data: a serializable workload description, the presets, and where a model comes from. No torch.

Building it (model, optimizer, batches) is :mod:`gaplan.workload.build`'s job; this part is what plan files,
caches, the worker protocol and reports read and write.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields

from gaplan.core.checkpointing import OFF, Checkpointing, check_typed, parse_checkpointing
from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError, positive_finite
from gaplan.core.tasks import CAUSAL_LM, CLASSIFICATION, MASKED_LM, SEQ2SEQ_LM
from gaplan.data.tasks.component import LOSS_CHUNKED, TARGET_LEN
from gaplan.data.tasks.registry import known_task, task_component, task_names, tasks_taking

DTYPE_NAMES = ("fp32", "bf16", "fp16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes an element, by DTYPE_NAMES' name
QUANTIZE = ("4bit", "nf4")  # 4bit: nf4 with double quantization (QLoRA's); nf4: without it (LitGPT's bnb.nf4)
ATTENTIONS = ("eager", "sdpa")  # transformers' attn_implementation: None keeps the model's default (sdpa where it has it)
INITS = ("auto", "pretrained", "random")  # auto: the folder's weights when it has them, else a random init
# The optimizers gaplan builds (gaplan.workload.optimizers), the choices of every command's --optimizer.
OPTIMIZERS = ("adamw", "adamw-fused", "adamw-forloop", "adamw-8bit", "paged-adamw-8bit", "adafactor", "lion", "sgd")
# torch's AdamW by its implementation (one update rule, the same states): its default (foreach on CUDA parameters,
# for-loop on the CPU), fused (one kernel per step, no temporaries), for-loop (one parameter at a time).
ADAMW_IMPLEMENTATIONS = ("adamw", "adamw-fused", "adamw-forloop")
SHARDED_OPTIMIZERS = ("adamw", "sgd")  # what --parallel fsdp trains with: the others keep states FSDP2 does not shard
LOSSES = ("plain", "chunked")  # --loss plain | chunked[:TOKENS] (gaplan.workload.chunked_loss)

# The fields that set how a step is split or run, not the step: memory and speed, not the math (both losses are
# token-exact), so a resumed run may change them (and re-plans). docs/resume.md has the table.
SPLIT_ONLY_FIELDS = ("grad_checkpointing", "attention", "parallel", "cpu_offload", "grad_sync", "compile", "loss")
DEFAULT_MODEL = "tiny-gpt2"

# Presets train without dropout (as most LLM pre-training does): accumulation over any split
# then gives the same gradient as one large batch, which the tests check bit for bit.
_NO_DROPOUT_GPT2 = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_NO_DROPOUT_BERT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_NO_DROPOUT_T5 = dict(dropout_rate=0.0)
# Llama-2's published config (meta-llama/Llama-2-*-hf config.json), less its shape.
_LLAMA_2 = dict(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                pad_token_id=0, tie_word_embeddings=False)

# name -> (config class name, config kwargs, task, default seq len, description)
PRESETS: dict[str, tuple[str, dict, str, int, str]] = {
    "tiny-gpt2": ("GPT2Config", dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=1024,
                                     bos_token_id=0, eos_token_id=0, **_NO_DROPOUT_GPT2),
                  CAUSAL_LM, 128, "GPT-2 style causal LM, 4 layers x 256, 6M parameters (default)"),
    "small-gpt2": ("GPT2Config", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                                      **_NO_DROPOUT_GPT2),
                   CAUSAL_LM, 512, "GPT-2 small shape, 124M parameters"),
    "tiny-llama": ("LlamaConfig", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=4, vocab_size=8192,
                                       max_position_embeddings=2048, bos_token_id=0, eos_token_id=0,
                                       pad_token_id=0),
                   CAUSAL_LM, 256, "Llama style causal LM (RMSNorm, RoPE, SwiGLU), 4 layers x 256, 7M parameters"),
    "tiny-bert-mlm": ("BertConfig", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                         intermediate_size=1024, vocab_size=8192, max_position_embeddings=512,
                                         **_NO_DROPOUT_BERT),
                      MASKED_LM, 128, "BERT style masked LM, 4 layers x 256, 5M parameters"),
    "tiny-bert-cls": ("BertConfig", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                         intermediate_size=1024, vocab_size=8192, max_position_embeddings=512,
                                         num_labels=4, **_NO_DROPOUT_BERT),
                      CLASSIFICATION, 128, "BERT style sequence classifier (4 classes), 4 layers x 256"),
    "tiny-t5": ("T5Config", dict(d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_decoder_layers=4, num_heads=4,
                                 vocab_size=8192, feed_forward_proj="gated-gelu", decoder_start_token_id=0,
                                 pad_token_id=0, eos_token_id=1, tie_word_embeddings=False, **_NO_DROPOUT_T5),
                SEQ2SEQ_LM, 128, "T5 v1.1 style encoder-decoder (gated GELU), 4 + 4 layers x 256, 12M parameters; "
                                   "targets half the source length by default"),
    # Published shapes, for planning (gaplan estimate / gaplan plan): a random init from the config, no download.
    "llama-2-7b": ("LlamaConfig", dict(_LLAMA_2, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                       num_attention_heads=32, num_key_value_heads=32),
                   CAUSAL_LM, 4096, "Llama-2-7B shape (32 layers x 4096, 6.7B parameters; random init, no weights)"),
    # Llama-3-8B's published config (meta-llama/Meta-Llama-3-8B config.json): grouped-query attention, a 128K vocab.
    "llama-3-8b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                       max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                       bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False),
                   CAUSAL_LM, 8192, "Llama-3-8B shape (32 layers x 4096, grouped-query attention, 128K vocab, 8.0B "
                                    "parameters; random init, no weights)"),
    "llama-2-13b": ("LlamaConfig", dict(_LLAMA_2, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                                        num_attention_heads=40, num_key_value_heads=40),
                    CAUSAL_LM, 4096, "Llama-2-13B shape (40 layers x 5120, 13B parameters; random init, no weights)"),
    "llama-2-70b": ("LlamaConfig", dict(_LLAMA_2, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                        num_attention_heads=64, num_key_value_heads=8),
                    CAUSAL_LM, 4096, "Llama-2-70B shape (80 layers x 8192, grouped-query attention, 69B parameters; "
                                     "random init, no weights)"),
}


# The learning rate when none is given: AdamW's usual 1e-3 learns in a few steps (so do its 8-bit forms and Adafactor
# at a fixed rate); SGD takes a cautious 1e-4, and so does Lion, whose sign update wants a rate 3-10x below AdamW's.
DEFAULT_LR = {"adamw": 1e-3, "adamw-fused": 1e-3, "adamw-forloop": 1e-3,
              "adamw-8bit": 1e-3, "paged-adamw-8bit": 1e-3, "adafactor": 1e-3, "lion": 1e-4,
              "sgd": 1e-4}
PARALLEL_LAYOUTS = ("ddp", "fsdp")
GRAD_SYNCS = ("last", "every")


@dataclass(frozen=True)
class WorkloadSpec:
    """A serializable description of a workload; built into a :class:`Workload` by :func:`build_workload`."""

    model: str = DEFAULT_MODEL
    task: str | None = None
    seq_len: int | None = None  # for seq2seq-lm: the source (encoder) length
    dtype: str = "fp32"
    optimizer: str = "adamw"
    # probe_key=False: no effect on memory, so a cached probe of another value still holds (same_workload).
    lr: float | None = field(default=None, metadata={"probe_key": False})  # None: DEFAULT_LR (``learning_rate``)
    # Which blocks recompute their activations in backward. Saved as a plan file has always held it (False, True or
    # "every:K" / "layers:N"): to_dict writes that form and from_dict reads it, the one place it is parsed.
    grad_checkpointing: Checkpointing = OFF
    # Added later: a plan file or worker message without these keys gets the defaults (WorkloadSpec.from_dict).
    init: str = field(default="auto", metadata={"probe_key": False})  # auto|pretrained|random: the starting weights
    weights_dtype: str = "fp32"  # the master weights' dtype (``dtype`` is the autocast compute dtype)
    trust_remote_code: bool = field(default=False, metadata={"probe_key": False})  # run the folder's own code
    parallel: str = "ddp"  # ddp (replicated) | fsdp (FSDP2 fully_shard per block and root)
    cpu_offload: bool = False  # fsdp only: parameters, gradients and optimizer states live on the CPU
    grad_sync: str = "last"  # fsdp only: reduce-scatter gradients on the last micro-step, or on every one
    # LoRA (peft): the base frozen in weights_dtype, adapters on lora_targets (None: peft's for the architecture,
    # "all-linear", or comma-separated module names) trained; quantize "4bit" is QLoRA (nf4, double quantization),
    # "nf4" the same without double quantization.
    lora: bool = False
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_targets: str | None = None
    quantize: str | None = None
    target_len: int | None = None  # seq2seq-lm: the target (decoder) length; None: half the source length
    attention: str | None = None  # eager | sdpa: transformers' attn_implementation (None: the model's default)
    # plain | chunked | chunked:TOKENS: the LM head and cross-entropy a chunk of positions at a time, recomputed in
    # backward, so the [B, T, V] logits never exist whole (gaplan.workload.chunked_loss)
    loss: str = "plain"
    # torch.compile the model (gaplan.workload.compile): changes what is saved for backward, so it is a probe key
    compile: bool = False

    def __post_init__(self) -> None:
        check_typed(self.grad_checkpointing)  # a typed field: text is parsed at the edge

    @property
    def learning_rate(self) -> float:
        """The learning rate to train with: the one given, else the optimizer's default."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_dict(self) -> dict:
        """The spec as plan files, caches and worker messages hold it (JSON); :meth:`from_dict` reads it back."""
        return {**asdict(self), "grad_checkpointing": self.grad_checkpointing.spec_value()}

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
        return self

    def validate(self) -> WorkloadSpec:
        """Check what can be checked without building anything."""
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
            raise OptionError(f"seq_len must be at least 2 (got {self.seq_len})", "seq_len")
        if self.attention is not None and self.attention not in ATTENTIONS:
            raise OptionError(f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTIONS)}", "attention")
        if self.target_len is not None and (not isinstance(self.target_len, int) or isinstance(self.target_len, bool)
                                            or self.target_len < 1):
            raise OptionError(f"target_len must be a positive integer (got {self.target_len})", "target_len")
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
        kind, _, tokens = self.loss.partition(":")
        if kind != "chunked":
            return None
        return int(tokens) if tokens else 0

    def _validate_loss(self, kind: str) -> None:
        name, colon, tokens = str(self.loss).partition(":")
        if name not in LOSSES or (colon and (name != "chunked" or not tokens.isdigit() or int(tokens) < 1)):
            raise OptionError(f"unknown loss {self.loss!r}; choose plain, chunked or chunked:TOKENS (a positive "
                              "number of positions a chunk, e.g. chunked:1024)", "loss")
        if name == "plain":
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
            if self.quantize:
                raise OptionError(f"quantize {self.quantize} is QLoRA: it quantizes the frozen base under lora adapters; "
                                  "add lora", "quantize", "lora")
            return
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
        if kind == "function":
            raise OptionError("lora does not apply to a module:function model (its function builds it): wrap it "
                              "with peft.get_peft_model there", "lora")
        if not isinstance(self.lora_r, int) or isinstance(self.lora_r, bool) or self.lora_r < 1:
            raise OptionError(f"lora_r must be a positive integer (got {self.lora_r})", "lora_r")
        if not positive_finite(self.lora_alpha):
            raise OptionError(f"lora_alpha must be a positive number (got {self.lora_alpha})", "lora_alpha")
        if not 0 <= self.lora_dropout < 1:
            raise OptionError(f"lora_dropout must be in [0, 1) (got {self.lora_dropout})", "lora_dropout")
        if self.lora_targets is not None and not self.lora_target_modules:
            raise OptionError("lora_targets names no module: give all-linear or names such as q_proj,v_proj", "lora_targets")

    @property
    def lora_target_modules(self) -> str | list[str] | None:
        """peft's ``target_modules``: None (its default for the architecture), ``"all-linear"``, or the names."""
        if self.lora_targets is None:
            return None
        if self.lora_targets.strip() == "all-linear":
            return "all-linear"
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]


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
