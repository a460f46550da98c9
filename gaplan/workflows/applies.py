"""Where each of ``gaplan train``'s conditional options applies: one declaration each, from which the docs' table
is rendered and a test gives every option where it does not apply (expecting a one-line refusal that names it).
The refusals themselves are raised where the options are checked (:class:`gaplan.data.source.DataSource`,
:class:`gaplan.workload.spec.WorkloadSpec`, :class:`gaplan.workflows.train_options.TrainOptions`,
:mod:`gaplan.plan.schedule`, :func:`check_tokens_apply` here); a new conditional option without a declaration here
fails the test. No torch at import (:func:`check_tokens_apply` reads the model's config when called).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gaplan.core.errors import GaplanError


@dataclass(frozen=True)
class Scope:
    """``flag`` applies only ``where``; ``misuse`` is a ``gaplan train`` command line (after ``train``) that gives it
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
)


def scope_table() -> str:
    """The Markdown table of :data:`TRAIN_SCOPES` (docs/train.md holds it between markers)."""
    rows = ["| option | applies only | given elsewhere, for example |", "|---|---|---|"]
    rows += [f"| `{s.flag}` | {s.where} | `gaplan train {' '.join(s.misuse)}` |" for s in TRAIN_SCOPES]
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
