"""The report's sections as document blocks: header, plan, tuner, probe, throughput, breakdown, training.

A plan made with ``--micro-batch`` had no probe: its sections say so and show what is known
(the budget or none, the parameter count, the task) instead of a probe's results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gaplan.core.checkpointing import parse_checkpointing
from gaplan.core.constants import BREAKDOWN_CATEGORIES, SAMPLES_PLAN_KIND, TOKEN_PLAN_KIND
from gaplan.core.units import format_bytes
from gaplan.plan.split import Plan
from gaplan.report.document import Block, Bullets, Heading, Image, Paragraph, Table
from gaplan.report.formatting import (
    CATEGORY_LABELS,
    byte_size,
    count,
    failure_reason,
    integer,
    missing,
    rate,
    shorten,
)
from gaplan.report.load import RunData, has_rows, memory_fit
from gaplan.report.throughput import throughput_section
from gaplan.report.training_report import report_title, training_section
from gaplan.runs.folder import BREAKDOWN_PNG, LENGTHS_PNG, MEMORY_PNG, PROBE_CSV
from gaplan.runs.probe_result import describe_allocator
from gaplan.workload.spec import DEFAULT_LR

_UNKNOWN_TASKS = ("", "?")  # "?" is what plans made without a probe recorded before the task was kept


def report_blocks(run: RunData, images: Sequence[str]) -> list[Block]:
    """The whole report; ``images`` names the charts that were written, in order."""
    plan = run.plan
    blocks: list[Block] = [Heading(1, report_title(run)), Bullets(header_items(run))]
    if run.is_training:  # a training run leads with what it trained; a probe or bench folder with its plan
        blocks += training_section(run, images)
    blocks += plan_section(run)
    if run.tokens is not None:
        blocks += token_section(run, images)
    if isinstance(plan.get("tuner"), dict):
        blocks += tuner_section(plan["tuner"])
    blocks += probe_section(run, images)
    if has_rows(run.throughput):
        blocks += throughput_section(run, images)
    if has_rows(run.breakdown):
        blocks += breakdown_section(run, images)
    return blocks


def _no_probe(run: RunData) -> str:
    if run.plan.get("token_budget"):
        return (f"this run packed its micro-batches within {int(run.plan['token_budget'])} padded tokens "
                "(`--batch-by tokens`; a probe of that budget writes its trials in its own folder)")
    return f"the micro-batch {int(run.plan['max_micro_batch'])} was given with `--micro-batch`"


def _budget_text(run: RunData) -> str:
    plan, limit, budget = run.plan, run.memory_limit, run.budget
    if limit is None:
        return "none" + ("" if run.probed else " (no probe ran)")
    text = format_bytes(limit) + (" (the device default)" if plan.get("budget_is_default") else " (set by the user)")
    if budget is not None and budget != limit:
        text += f", probed under {format_bytes(budget)} ({float(plan.get('margin') or 0):.0%} margin)"
    return text


def header_items(run: RunData) -> list[str]:
    plan = run.plan
    workload = plan["workload"]
    task = next((str(t) for t in (plan.get("task"), workload.get("task")) if t and str(t) not in _UNKNOWN_TASKS),
                "unknown")
    seq_len = plan.get("seq_len") or workload.get("seq_len")
    checkpointing = parse_checkpointing(workload.get("grad_checkpointing"))
    torch_version = plan.get("torch_version")
    versions = f"gaplan {plan.get('gaplan_version', 'unknown')}, " + (f"torch {torch_version}" if torch_version
                                                                      else "torch version not recorded")
    return [
        f"**Model:** {run.model}, {count(plan.get('param_count'))} parameters",
        f"**Task:** {task}, sequence length {seq_len if seq_len else 'unknown'}",
        f"**Training setup:** {workload.get('dtype', '?')}, optimizer {workload.get('optimizer', '?')}"
        f" (lr {_learning_rate(workload)}), gradient checkpointing {checkpointing}",
        f"**Device:** {plan['device']}",
        f"**Memory budget:** {_budget_text(run)}",
        f"**Versions:** {versions}",
        *_allocator_items(plan),
        f"**Created:** {plan.get('created') or 'unknown'}",
        *([_reused_probe_text(plan["reused_probe"])] if isinstance(plan.get("reused_probe"), dict) else []),
        *_reproduce(run),
    ]


def _reproduce(run: RunData) -> list[str]:
    """How the run came to be: a training run's start and the resumes that changed it (its train.json), else the
    command in plan.json (a resume writes its own there)."""
    commands = run.commands or ([run.plan["command"]] if run.plan.get("command") else [])
    return [f"**Reproduce with:** {', then '.join(f'`{command}`' for command in commands)}"] if commands else []


def _allocator_items(plan: dict[str, Any]) -> list[str]:
    """The CUDA allocator's setting the trials ran under: always on CUDA; on CPU only when one was set (torch's CPU
    allocator reads none of it, which the line says)."""
    setting = plan.get("allocator_setting")
    if str(plan.get("device", "")).startswith("cuda"):
        return [f"**CUDA allocator:** {describe_allocator(setting if isinstance(setting, dict) else None)}"]
    if isinstance(setting, dict) and setting:
        return [f"**CUDA allocator:** {describe_allocator(setting)} (no effect on a CPU run)"]
    return []


def _reused_probe_text(reused: dict[str, Any]) -> str:
    """A probe taken from the cache: its trials and B* are an earlier run's, which the report must say."""
    return (f"**Probe reused from the cache:** probed {reused.get('created') or 'at an unknown date'}, cache key "
            f"`{reused.get('key') or '?'}` (`{reused.get('path') or '?'}`); the trials and B\\* below are that "
            "probe's, not this run's")


def _learning_rate(workload: dict[str, Any]) -> str:
    """The rate trained with: a plan records ``lr: null`` when the optimizer's default was taken."""
    lr = workload.get("lr")
    if lr is None and workload.get("optimizer") in DEFAULT_LR:
        return f"{DEFAULT_LR[workload['optimizer']]:g}, the optimizer's default"
    return "?" if lr is None else f"{lr:g}"


def plan_section(run: RunData) -> list[Block]:
    plan, trials = run.plan, run.trials
    best = int(plan["max_micro_batch"])
    if plan.get("token_budget"):  # each step packed anew: the plan's micro-batch is no size it trained
        items = [f"**Micro-batches:** packed each step within {integer(plan['token_budget'])} padded tokens a rank "
                 "(`--batch-by tokens`): no fixed micro-batch; each step's effective batch is in `train_log.csv`"]
    elif run.probed:
        capped = " (the search stopped at its upper limit: larger micro-batches may fit too)" if plan.get("capped") else ""
        items = [f"**B\\* (largest micro-batch that fits the budget):** {best}{capped}"]
    else:
        items = [f"**Largest micro-batch:** {best}, given with `--micro-batch` (not probed)"]
    rank = " (sizes on rank 0)" if int(plan["plan"].get("world_size") or 1) > 1 else ""
    if not plan.get("token_budget"):
        items.append(f"**Plan:** {Plan.from_dict(plan['plan']).describe()}{rank}")
    if (plan.get("workload") or {}).get("parallel") == "fsdp" and run.probed:
        ranks = int(plan.get("trial_ranks") or plan["plan"].get("world_size") or 1)
        items.append(f"**Layout:** FSDP2, sharded over {ranks} ranks; every trial ran all {ranks}, each under the "
                     "budget: budget, peaks and static memory are per rank (the largest rank's)")
    budget = run.budget
    at_best = trials[(trials["micro_batch"] == best) & trials["fits"] & trials["peak_bytes"].notna()]
    if not at_best.empty and budget is not None:
        peak = int(at_best["peak_bytes"].max())
        limit = "budget" if budget == run.memory_limit else "probe limit"
        items.append(f"**Peak at B\\*:** {format_bytes(peak)} of {format_bytes(budget)} ({peak / budget:.0%} of the {limit})")
    if plan.get("static_bytes"):
        items.append(f"**Static memory:** {format_bytes(plan['static_bytes'])} for weights, gradients and optimizer states")
    fit = memory_fit(trials)
    if fit is not None:
        items.append(f"**Memory line (fit over {fit.points} trials):** {format_bytes(fit.fixed_bytes)}"
                     f" + {format_bytes(fit.bytes_per_sample)} per sample")
    planned = int(plan["plan"]["micro_batch"])
    if run.probed and planned != best:
        items.append(_planned_peak_text(trials, planned, fit))
    if not run.probed:
        items.append(f"**Probe:** none, {_no_probe(run)}")
    else:
        wall = plan.get("wall_seconds")
        items.append(f"**Probe:** {len(trials)} trials" + (f" in {float(wall):.1f} s" if wall is not None else ""))
    return [Heading(2, "Plan"), Bullets(items)]


def _planned_peak_text(trials: Any, planned: int, fit: Any) -> str:
    """The peak at the micro-batch the plan trains with (not B*), where the bench and training peaks are compared."""
    at = trials[(trials["micro_batch"] == planned) & trials["fits"] & trials["peak_bytes"].notna()]
    if not at.empty:
        return (f"**Peak at the planned micro-batch ({planned}):** {format_bytes(int(at['peak_bytes'].max()))}, "
                "measured by a trial")
    if fit is None:
        return f"**Peak at the planned micro-batch ({planned}):** not measured (no memory line)"
    return (f"**Peak at the planned micro-batch ({planned}):** about "
            f"{format_bytes(fit.fixed_bytes + fit.bytes_per_sample * planned)}, from the memory line (no trial ran "
            "at that size); the same measure as the bench's and training's peak (step)")


def token_section(run: RunData, images: Sequence[str]) -> list[Block]:
    """``--batch-by tokens``: the data's lengths, T* and the two probes it rests on, and the token plan against
    the samples plan when a bench measured them."""
    from gaplan.plan.tokens import LengthProfile, TokenBudget

    tokens = run.tokens
    assert tokens is not None
    profile = LengthProfile(**{**tokens["profile"], "histogram": tuple(map(tuple, tokens["profile"]["histogram"]))})
    budget = TokenBudget(**tokens["token_budget"])
    data = tokens.get("data") or {}
    items = []
    if data.get("path"):
        tokenizer = data.get("tokenizer") or "the model folder's"
        items.append(f"**Data:** `{data['path']}`, tokenizer {tokenizer}"
                     + (f", {integer(data['samples'])} samples from {integer(data['read'])} records"
                        if data.get("samples") is not None and data.get("read") is not None else ""))
    items += [f"**Lengths:** {profile.describe()}",
              "**Token budget:** " + budget.describe().replace("*", "\\*"),
              f"**Edges:** B\\* = {budget.long_edge} at the longest length ({budget.longest} tokens), "
              f"{budget.short_edge} at the shortest ({budget.shortest} tokens)"]
    blocks: list[Block] = [Heading(2, "Token budget"), Bullets(items)]
    if LENGTHS_PNG in images:
        blocks.append(Image(LENGTHS_PNG, "Sample lengths"))
    blocks.append(Table(["lengths (tokens)", "samples"], [[f"{low}-{high}", integer(n)]
                                                          for low, high, n in profile.histogram], frozenset({1})))
    frame = run.throughput
    if has_rows(frame) and "batch_by" in frame.columns:
        compared = frame[frame["kind"].isin([TOKEN_PLAN_KIND, SAMPLES_PLAN_KIND])]
        if not compared.empty:
            rows = [[row["split"], rate(row["samples_per_s"]), rate(row["tokens_per_s"]),
                     "-" if missing(row["padding_fraction"]) else f"{float(row['padding_fraction']):.1%}",
                     "-" if missing(row["micro_steps_mean"]) else f"{float(row['micro_steps_mean']):.1f}",
                     byte_size(row["peak_bytes"]),
                     "-" if missing(row["tokens_ratio"]) else f"{float(row['tokens_ratio']):.2f}x"]
                    for _, row in compared.iterrows()]
            blocks.append(Heading(3, "Token plan vs samples plan"))
            blocks.append(Paragraph("The same optimizer steps of the same data under the same budget; real tokens "
                                    "exclude padding; rates are medians over fresh runs, warm-up excluded. The "
                                    "ratio is real tokens/s relative to the samples plan. Peaks are the whole "
                                    "training process's (libraries included; the budget counts what training "
                                    "allocates past them)."))
            blocks.append(Table(["plan", "samples/s", "real tokens/s", "padding", "micro-steps per step",
                                 "process peak",
                                 "tokens/s ratio"], rows, frozenset({1, 2, 3, 4, 5, 6})))
    return blocks


def tuner_section(tuner: dict[str, Any]) -> list[Block]:
    checkpointing = tuner.get("grad_checkpointing")
    choice = f"micro-batch {tuner.get('micro_batch', '?')}"
    if checkpointing is not None:
        choice += f", gradient checkpointing {parse_checkpointing(checkpointing)}"
    items = [f"**Objective:** {tuner.get('objective', 'unknown')}", f"**Chosen:** {choice}"]
    if tuner.get("reason"):
        items.append(f"**Why:** {tuner['reason']}")
    return [Heading(2, "Tuner decision"), Bullets(items)]


def probe_section(run: RunData, images: Sequence[str]) -> list[Block]:
    if not run.probed:
        return [Heading(2, "Probe"),
                Paragraph(f"No probe ran: {_no_probe(run)}, so there are no trials, no memory line and no "
                          "measured edge of the budget.")]
    blocks: list[Block] = [Heading(2, "Probe trials")]
    if MEMORY_PNG in images:
        blocks.append(Image(MEMORY_PNG, "Peak memory by micro-batch"))
    rows = []
    for number, trial in enumerate(run.trials.itertuples(index=False), start=1):
        if trial.fits:
            error = "" if missing(trial.error) else shorten(str(trial.error), 80)
        else:
            error = failure_reason(trial.error, trial.completed_steps)
        rows.append([str(number), str(trial.micro_batch), "fits" if trial.fits else "OOM", byte_size(trial.peak_bytes),
                     byte_size(trial.micro_steps_peak_bytes), integer(trial.completed_steps),
                     "-" if missing(trial.seconds) else f"{trial.seconds:.1f}", error])
    note = f"In the order they ran; results also in `{PROBE_CSV}`."
    steps = run.trials.loc[run.trials["fits"], "completed_steps"].dropna()
    if len(steps) and steps.min() < steps.max():
        note += (f" A size that fitted after {int(steps.min())} optimizer step is a sketch: a doubling that only draws "
                 f"the memory line; the answer rests on {int(steps.max())}-step trials.")
    blocks.append(Paragraph(note))
    blocks.append(Table(["#", "micro-batch", "result", "peak (step)", "peak (fwd/bwd)", "steps done", "seconds", "error"],
                        rows, frozenset({0, 1, 3, 4, 5, 6})))
    return blocks


def breakdown_section(run: RunData, images: Sequence[str]) -> list[Block]:
    frame = run.breakdown
    assert frame is not None
    rows = []
    for _, row in frame.iterrows():
        total = row["tracked_total"]
        if missing(total):
            total = sum(0 if missing(row[c]) else row[c] for c in BREAKDOWN_CATEGORIES)
        rows.append([integer(row["micro_batch"]), *[byte_size(row[c]) for c in BREAKDOWN_CATEGORIES], byte_size(total),
                     byte_size(row["device_peak_bytes"])])
    blocks: list[Block] = [Heading(2, "Memory breakdown")]
    if BREAKDOWN_PNG in images:
        blocks.append(Image(BREAKDOWN_PNG, "Memory by category"))
    blocks.append(Paragraph(f"At the step's peak, as torch's MemTracker tags each tensor; **{CATEGORY_LABELS['other']}**."))
    headers = ["micro-batch", *[CATEGORY_LABELS[c].split(" (")[0] for c in BREAKDOWN_CATEGORIES], "tracked total",
               "device peak"]
    blocks.append(Table(headers, rows, frozenset(range(len(headers)))))
    return blocks
