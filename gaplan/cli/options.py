"""Options shared by the ``gaplan`` commands (click): their flags and help, and what the parser knows (which were
given, the command line). The checks are below the CLI (:mod:`gaplan.workflows.parse_options` and each command's
options object). No torch."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

import click

from gaplan.cli.option_types import BYTES, CHECKPOINTING

WORKLOAD_HELP = "Presets: tiny-gpt2 (default), small-gpt2, tiny-llama, tiny-bert-mlm, tiny-bert-cls, tiny-t5."


# The task and the lengths, shared by the commands that build a model and by gaplan plan.
TASK_AND_LENGTHS = (
    click.option("--task", default=None, metavar="TASK",
                 help="causal-lm, masked-lm, classification or seq2seq-lm (default: the model's own; an "
                      "encoder-decoder such as T5 or BART is seq2seq-lm)."),
    click.option("--seq-len", type=int, default=None,
                 help="Sequence length of every sample; for seq2seq-lm the source (encoder) length "
                      "(default: the model's)."),
    click.option("--source-len", type=int, default=None, help="seq2seq-lm: the source length (--seq-len's other name)."),
    click.option("--target-len", type=int, default=None,
                 help="seq2seq-lm: the target (decoder) length (default: half the source length)."),
    click.option("--attention", type=click.Choice(["eager", "sdpa"]), default=None,
                 help="transformers' attention implementation where the model has both (default: the model's, sdpa "
                      "where it has it): eager keeps the seq x seq probabilities for backward, sdpa does not."),
)


def task_and_lengths(func: Callable) -> Callable:
    """``--task``, ``--seq-len``/``--source-len`` and ``--target-len``."""
    for option in reversed(TASK_AND_LENGTHS):
        func = option(func)
    return func


def workload_options(func: Callable) -> Callable:
    """Options that describe what is trained, shared by every command that builds a model."""
    from gaplan.workload.spec import OPTIMIZERS

    options = [
        click.option("--model", default="tiny-gpt2", show_default=True, metavar="NAME|DIR|MODULE:FUNC",
                     help="A preset, a Hugging Face model directory or cached id, or module:function. "
                          + WORKLOAD_HELP),
        *TASK_AND_LENGTHS,
        click.option("--dtype", default="fp32", show_default=True, metavar="fp32|bf16|fp16",
                     help="Compute dtype (autocast; weights keep --weights-dtype)."),
        click.option("--optimizer", default="adamw", show_default=True, metavar="|".join(OPTIMIZERS)),
        click.option("--lr", type=float, default=None, help="Learning rate (default: 1e-3 for adamw, its 8-bit forms and "
                                                            "adafactor; 1e-4 for lion and sgd)."),
        click.option("--loss", default="plain", show_default=True, metavar="plain|chunked[:TOKENS]",
                     help="chunked: the LM head and cross-entropy TOKENS positions at a time, recomputed in backward, so "
                          "the [B, T, V] logits never exist whole (causal-lm and seq2seq-lm; default TOKENS: 16 MiB of "
                          "fp32 logits)."),
        click.option("--grad-checkpointing", type=CHECKPOINTING, default=None, is_flag=False, flag_value="on",
                     metavar="off|on|every:K|layers:N|ops|auto",
                     help="Recompute activations in backward: on (every block), off (default), every:K (every K-th "
                          "block), layers:N (the first N blocks), ops (every block at the op level, torchtitan's "
                          "policy: matmul outputs, but every second, and attention outputs kept; the rest "
                          "recomputed), or auto (probe: on only when a larger micro-batch fits and wins on "
                          "throughput)."),
        click.option("--compile", is_flag=True,
                     help="torch.compile the model (inductor), so the probe measures the compiled step (the estimate "
                          "traces the eager model; on the CPU it needs a C++ compiler)."),
        click.option("--init", type=click.Choice(["auto", "pretrained", "random"]), default="auto", show_default=True,
                     help="A model folder's weights: auto (its weights when it has them, else a random init), "
                          "pretrained (require them) or random (a fresh init from the config)."),
        click.option("--weights-dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
                     show_default=True, help="Dtype of the master weights (--dtype is the autocast compute dtype)."),
        click.option("--trust-remote-code", is_flag=True, help="Let transformers run the model folder's own code."),
        click.option("--parallel", type=click.Choice(["ddp", "fsdp"]), default="ddp", show_default=True,
                     help="Over several ranks: ddp (replicated) or fsdp (FSDP2, each block sharded over the ranks)."),
        click.option("--cpu-offload", is_flag=True,
                     help="With --parallel fsdp: keep parameters, gradients and optimizer states on the CPU."),
        click.option("--grad-sync", type=click.Choice(["last", "every"]), default="last", show_default=True,
                     help="With --parallel fsdp: reduce-scatter gradients on the last micro-step only, or on "
                          "every one (gradients stay sharded between micro-steps: less memory, more traffic)."),
        click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda[:N]"),
        click.option("--memory-limit", type=BYTES, default=None, metavar="SIZE",
                     help="Memory budget, e.g. 2GiB or 800MB (CPU default 1 GiB; CUDA default: the card)."),
        click.option("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)."),
    ]
    for option in reversed(options):
        func = option(func)
    return lora_options(func)


def lora_options(func: Callable) -> Callable:
    """LoRA (peft) and QLoRA: the base frozen, adapters trained; shared by probe, train, bench, estimate and plan."""
    options = [
        click.option("--lora", is_flag=True, help="Train LoRA adapters (peft) on a frozen base: only the adapters "
                                                   "have gradients and optimizer states."),
        click.option("--lora-r", type=int, default=16, show_default=True, help="LoRA rank."),
        click.option("--lora-alpha", type=float, default=32.0, show_default=True, help="LoRA scaling alpha."),
        click.option("--lora-dropout", type=float, default=0.05, show_default=True, help="Dropout on the adapters' input."),
        click.option("--lora-targets", default=None, metavar="all-linear|M1,M2",
                     help="Modules that get adapters: all-linear, or names such as q_proj,v_proj (default: peft's "
                          "for the architecture, e.g. c_attn for GPT-2, q_proj,v_proj for Llama)."),
        click.option("--lora-config", default=None, metavar="FILE|DIR",
                     help="An adapter_config.json (or its folder): r, alpha, dropout and targets from it (they take "
                          "the place of the --lora-* options); implies --lora."),
        click.option("--quantize", type=click.Choice(list(_quantize_choices())), default=None,
                     help="QLoRA: the frozen base in 4-bit nf4, 4bit with double quantization (QLoRA's), nf4 without "
                          "it (LitGPT's bnb.nf4); bitsandbytes >= 0.46, which runs it on CUDA and on the CPU."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def data_options(func: Callable) -> Callable:
    """Options that name the training data and how it is read (train, and probe/bench ``--batch-by tokens``)."""
    options = [
        click.option("--data", default=None, metavar="PATH",
                     help="Text file (a sample a line), JSONL, a datasets folder (save_to_disk) or a .parquet file."),
        click.option("--text-field", default=None,
                     help="The text field of JSONL, datasets or parquet data.  [default: text]"),
        click.option("--label-field", default=None,
                     help="The label field (classification only).  [default: label]"),
        click.option("--target-field", default=None,
                     help="The target text's field (seq2seq-lm only; --text-field is the source's).  [default: target]"),
        click.option("--long-samples", type=click.Choice(["split", "truncate"]), default=None,
                     help="Samples longer than --seq-len: split into seq-len chunks, or truncate them.  [default: "
                          "split]"),
        click.option("--tokenizer", default=None, metavar="bytes|DIR",
                     help="Tokenizer for --data: the model folder's own by default; 'bytes' for byte tokens; "
                          "or a folder."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def batch_by_options(func: Callable) -> Callable:
    """``--batch-by`` and ``--granule``: micro-batches of a number of samples, or packed within a token budget."""
    options = [
        click.option("--batch-by", type=click.Choice(["samples", "tokens"]), default="samples", show_default=True,
                     help="samples: micro-batches of a fixed number of samples; tokens: each step's samples packed "
                          "into micro-batches of at most T padded tokens (long-tailed data wastes less on padding; "
                          "T* is probed from --data's lengths)."),
        click.option("--granule", type=int, default=None,
                     help="With --batch-by tokens: a probed token budget is a multiple of this many tokens.  "
                          "[default: 64]"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def timing_options(func: Callable) -> Callable:
    """How splits are timed (:class:`gaplan.benchmark.measurement.BenchSettings`, by field): rounds, repeats, when
    to stop, which splits."""
    options = [
        click.option("--repeats", type=int, default=2, show_default=True,
                     help="Timed optimizer steps per split in each round."),
        click.option("--warmup", type=int, default=1, show_default=True,
                     help="Untimed optimizer steps first, in every timed run."),
        click.option("--rounds", type=int, default=3, show_default=True,
                     help="Interleaved rounds at least (each times every split once, in a fresh process)."),
        click.option("--max-rounds", type=int, default=10, show_default=True, help="Rounds at most."),
        click.option("--ci-target", type=float, default=0.05, show_default=True,
                     help="Stop once the plan's ratio to the large batch is known to this fraction (95%% interval)."),
        click.option("--time-budget", type=float, default=300.0, show_default=True, metavar="SECONDS",
                     help="Past --rounds, start no round that would end after this many seconds of timing."),
        click.option("--all-splits", is_flag=True,
                     help="Time every split from B* down by powers of two (default: the plan and its two neighbours)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


OVERWRITE_OPTION = click.option(
    "--overwrite", is_flag=True,
    help="Replace the run that --out holds: its gaplan files are removed first (the folder's other files are kept). "
         "Without it, an --out that holds a run is refused.")

SEARCH_CAP_OPTION = click.option("--search-cap", "--max-micro-batch", "search_cap", type=int, default=None,
                                 help="Do not try micro-batches above this (default: the effective batch per "
                                      "device, ceil(E/W): a larger one is never used by the plan).")


def spec_from_options(options: dict[str, Any]):
    """The workload of the parsed options (:func:`gaplan.workflows.parse_options.spec_from_flat`), with the options
    given on this command line (none outside a command's run)."""
    from gaplan.workflows.parse_options import spec_from_flat

    ctx = click.get_current_context(silent=True)
    return spec_from_flat(options, given_on_command_line(ctx) if ctx else ())


def command_line() -> str:
    """This invocation as a shell command, recorded in plan.json so a report says how to reproduce it.

    Rebuilt from the options given (not from ``sys.argv``, which is the host program's when gaplan is
    called in-process, as by click's test runner); defaults are left out, as the user left them out.
    """
    ctx = click.get_current_context()
    words = ["gaplan", ctx.info_name or ""]
    given = given_on_command_line(ctx)
    for param in ctx.command.params:
        if param.name not in given or not isinstance(param, click.Option):
            continue
        flag, value = max(param.opts, key=len), ctx.params[param.name]
        if param.is_flag:
            words += [flag] if value else param.secondary_opts[-1:]
        else:
            for item in value if param.multiple else [value]:
                words += [flag, str(item)]
    return " ".join(map(shlex.quote, words))


def stderr_printer(quiet: bool) -> Callable[[str], None]:
    return (lambda text: None) if quiet else (lambda text: click.echo(text, err=True))


def given_on_command_line(ctx: click.Context) -> set[str]:
    """The options the user gave (not defaults): on the command line, or in ``--config``'s file other than an
    option's default; what ``--resume`` checks against the saved run."""
    from click.core import ParameterSource

    from gaplan.cli.config_file import from_config_file

    return {name for name in ctx.params
            if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
            or from_config_file(ctx, name)}


def _quantize_choices() -> tuple[str, ...]:
    """--quantize's choices: the workload's own (gaplan.workload.spec.QUANTIZE)."""
    from gaplan.workload.spec import QUANTIZE

    return QUANTIZE
