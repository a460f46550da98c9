"""Where each command's conditional options apply: one declaration each (:data:`SCOPES`, by command), from which
the docs' tables are rendered and a test gives every option where it does not apply (expecting a one-line refusal
that names it). The refusals themselves are raised where the options are checked
(:class:`gaplan.data.source.DataSource`, :class:`gaplan.workload.spec.WorkloadSpec`,
:class:`gaplan.workflows.train_options.TrainOptions`, :mod:`gaplan.plan.schedule`, each command's object in
``gaplan/workflows/*_options.py``, :func:`check_tokens_apply` here); a new conditional option without a declaration
here fails the test. No torch at import (:func:`check_tokens_apply` reads the model's config when called).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gaplan.core.errors import GaplanError


@dataclass(frozen=True)
class Scope:
    """``flag`` applies only ``where``; ``misuse`` is a command line (after the command's name) that gives it
    elsewhere (``{data}``: a JSONL file of text records)."""

    flag: str
    where: str
    misuse: tuple[str, ...]


TRAIN_SCOPES = (
    Scope("--text-field", "with `--data` (JSONL, datasets, parquet)", ("--text-field", "body")),
    Scope("--long-samples", "with `--data`", ("--long-samples", "truncate")),
    Scope("--tokenizer", "with `--data`", ("--tokenizer", "bytes")),
    Scope("--label-field", "with `--data`, task `classification`", ("--data", "{data}", "--label-field", "y")),
    Scope("--target-field", "with `--data`, task `seq2seq-lm`", ("--data", "{data}", "--target-field", "y")),
    Scope("--cpu-offload", "`--parallel fsdp`", ("--cpu-offload",)),
    Scope("--offload-activations", "a CUDA device", ("--offload-activations",)),
    Scope("--grad-sync", "`--parallel fsdp` (`every`; `last` is DDP's too)", ("--grad-sync", "every")),
    Scope("--lora-r", "`--lora` (as `--lora-alpha`, `--lora-dropout`, `--lora-targets`)", ("--lora-r", "8")),
    Scope("--merge", "`--save-model` with `--lora`", ("--merge",)),
    Scope("--effective-batch-min", "`--batch-schedule adaptive` or `warmup:STEPS`", ("--effective-batch-min", "4")),
    Scope("--lr-scaling", "a `--plan` of `gaplan probe --objective goodput`, or `--batch-schedule`",
          ("--lr-scaling", "sqrt")),
    Scope("--token-budget", "`--batch-by tokens`", ("--token-budget", "64")),
    Scope("--effective-tokens", "`--batch-by tokens`", ("--effective-tokens", "256")),
    Scope("--granule", "`--batch-by tokens`", ("--granule", "32")),
    Scope("--token-plan", "`--batch-by tokens`", ("--token-plan", "tokens.json")),
    Scope("--target-len", "task `seq2seq-lm`", ("--target-len", "8")),
    Scope("--quantize", "`--lora` (QLoRA)", ("--quantize", "4bit")),
    Scope("--loss", "`chunked`: tasks `causal-lm` and `seq2seq-lm` (`plain` everywhere)",
          ("--model", "tiny-bert-cls", "--loss", "chunked")),
    Scope("--overwrite", "without `--resume` (it replaces a run, `--resume` continues one)",
          ("--resume", "reports/run", "--overwrite")),
)


# Shared by every command that builds a model from the workload options.
WORKLOAD_SCOPES = (
    Scope("--cpu-offload", "`--parallel fsdp`", ("--cpu-offload",)),
    Scope("--offload-activations", "a CUDA device", ("--device", "cpu", "--offload-activations")),
    Scope("--grad-sync", "`--parallel fsdp` (`every`; `last` is DDP's too)", ("--grad-sync", "every")),
    Scope("--lora-r", "`--lora` (as `--lora-alpha`, `--lora-dropout`, `--lora-targets`)", ("--lora-r", "8")),
    Scope("--quantize", "`--lora` (QLoRA)", ("--quantize", "4bit")),
    Scope("--target-len", "task `seq2seq-lm`", ("--target-len", "8")),
    Scope("--loss", "`chunked`: tasks `causal-lm` and `seq2seq-lm` (`plain` everywhere)",
          ("--model", "tiny-bert-cls", "--loss", "chunked")),
)
# The data options without --data (their task-dependent part is checked where the data is read, as train's is).
DATA_SCOPES = tuple(Scope(flag, "with `--data`", (flag, value)) for flag, value in (
    ("--text-field", "body"), ("--label-field", "y"), ("--target-field", "y"), ("--long-samples", "truncate"),
    ("--tokenizer", "bytes")))
TIMED = "`--report`, `--objective throughput` or `goodput`, `--grad-checkpointing auto` (how their splits are timed)"
BY_TOKENS = ("--batch-by", "tokens", "--data", "{data}")

PROBE_SCOPES = WORKLOAD_SCOPES + DATA_SCOPES + (
    Scope("--batch-range", "`--objective goodput`", ("--batch-range", "4:64")),
    Scope("--measure-steps", "`--objective goodput`", ("--measure-steps", "10")),
    Scope("--data", "`--batch-by tokens`, `--objective goodput` (its measuring run)", ("--data", "{data}")),
    Scope("--granule", "`--batch-by tokens`", ("--granule", "32")),
    Scope("--target", "a CUDA device (a smaller GPU emulated on a larger one)", ("--target", "h100-80gb")),
    Scope("--report", "a probe by samples", (*BY_TOKENS, "--report")),
    Scope("--objective", "a probe by samples", (*BY_TOKENS, "--objective", "throughput")),
    Scope("--seed-from-estimate", "a probe by samples", (*BY_TOKENS, "--seed-from-estimate")),
    Scope("--search-cap", "a probe by samples", (*BY_TOKENS, "--search-cap", "4")),
    Scope("--margin", "a probe by samples", (*BY_TOKENS, "--margin", "0.1")),
    Scope("--emit", "a probe by samples", (*BY_TOKENS, "--emit", "hf")),
    *(Scope(flag, TIMED, (flag, *value)) for flag, value in (
        ("--repeats", ("3",)), ("--warmup", ("2",)), ("--rounds", ("4",)), ("--max-rounds", ("5",)),
        ("--ci-target", ("0.1",)), ("--time-budget", ("60",)), ("--all-splits", ()))),
)

BENCH_SCOPES = WORKLOAD_SCOPES + DATA_SCOPES + (
    Scope("--data", "`--batch-by tokens`", ("--data", "{data}")),
    Scope("--granule", "`--batch-by tokens`", ("--granule", "32")),
    Scope("--world-size", "`--parallel fsdp` (a DDP split is timed in one process)", ("--world-size", "2")),
    Scope("--plan", "a bench by samples", (*BY_TOKENS, "--plan", "plan.json")),
    *(Scope(flag, "a bench by samples", (*BY_TOKENS, flag, *value)) for flag, value in (
        ("--max-rounds", ("5",)), ("--ci-target", ("0.1",)), ("--time-budget", ("60",)), ("--all-splits", ()),
        ("--no-large-batch", ()))),
)

ESTIMATE_SCOPES = WORKLOAD_SCOPES + (
    Scope("--target", "a GPU (not `--device cpu`)", ("--device", "cpu", "--target", "h100-80gb")),
)

PLAN_SCOPES = (
    Scope("--lora-r", "`--lora` (as `--lora-alpha`, `--lora-dropout`, `--lora-targets`)", ("--lora-r", "8")),
    Scope("--quantize", "`--lora` (QLoRA)", ("--quantize", "4bit")),
    Scope("--target-len", "task `seq2seq-lm`", ("--target-len", "8")),
    Scope("--target", "`--device cuda`, without `--measure`", ("--device", "cpu", "--target", "h100-80gb")),
    Scope("--grad-sync", "the FSDP layouts of `--layouts`", ("--layouts", "ddp", "--grad-sync", "every")),
    Scope("--repeats", "`--measure`", ("--repeats", "2")),
    Scope("--threads", "`--device cpu`", ("--threads", "2")),
)

SCOPES = {"train": TRAIN_SCOPES, "probe": PROBE_SCOPES, "bench": BENCH_SCOPES, "estimate": ESTIMATE_SCOPES,
          "plan": PLAN_SCOPES}


def scope_table(command: str = "train") -> str:
    """The Markdown table of ``command``'s :data:`SCOPES` (its docs page holds it between markers)."""
    rows = ["| option | applies only | given elsewhere, for example |", "|---|---|---|"]
    rows += [f"| `{s.flag}` | {s.where} | `gaplan {command} {' '.join(s.misuse)}` |" for s in SCOPES[command]]
    return "\n".join(rows)


def check_tokens_apply(spec: Any) -> None:
    """A token budget is one length per sample: a seq2seq-lm sample has two, so ``--batch-by tokens`` is refused."""
    from gaplan.data.tasks.registry import task_component
    from gaplan.workload.spec import model_source_kind

    if model_source_kind(spec.model) == "function":
        return
    from gaplan.workload.build import model_shape

    if spec.target_len is not None or task_component(model_shape(spec)[0]).has_target:
        raise GaplanError("--batch-by tokens budgets one length per sample; a seq2seq-lm sample has two (source and "
                          "target), so it is not supported there: batch by samples (the default)")
