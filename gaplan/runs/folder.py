"""A run folder's layout: its default name and every file in it. Writers and ``gaplan report`` use these names."""

from __future__ import annotations

import datetime
import os
import re

PLAN_JSON = "plan.json"  # the probe (or the given plan) and the plan: gaplan.runs.schema reads and writes it
PROBE_CSV = "probe.csv"  # the probe's trials, one row each
THROUGHPUT_CSV = "throughput.csv"  # bench: one row per split
BREAKDOWN_CSV = "breakdown.csv"  # peak bytes by category at the probed sizes
TRAIN_LOG_CSV = "train_log.csv"  # train: one row per optimizer step
CHECKPOINT = "checkpoint.pt"  # train: model, optimizer, scheduler, RNG states, step
SHARDED_STATE_PREFIX = "checkpoint-shards-step"  # train --parallel fsdp: a folder of each rank's shards per checkpoint
TRAIN_JSON = "train.json"  # train: the workload and options the run was started with, for --resume
CONFIG_TOML = "config.toml"  # train: the run's options as --config reads them (gaplan train --config DIR/config.toml)
LOSS_CHECK_JSON = "loss_check.json"  # train: step 1's accumulated loss against the same samples as one batch
BENCH_JSON = "bench.json"  # bench: how the rounds ended, the plan's ratio with its interval, signs of contention
TOKENS_JSON = "tokens.json"  # probe/bench --batch-by tokens: the data's length profile and the token budget T*
MEMORY_PNG = "memory.png"
BREAKDOWN_PNG = "breakdown.png"
THROUGHPUT_PNG = "throughput.png"
TRAINING_PNG = "training.png"
LENGTHS_PNG = "lengths.png"  # the histogram of the data's sample lengths (--batch-by tokens)
LAYOUTS_CSV, LAYOUTS_JSON, LAYOUTS_PNG = "layouts.csv", "layouts.json", "layouts.png"  # plan: the layouts compared
LEVERS_STEM = "levers"  # plan on one device: the lever table, levers.md and levers.html
LEVERS_CSV, LEVERS_JSON, LEVERS_MD, LEVERS_HTML = (f"{LEVERS_STEM}.{kind}" for kind in ("csv", "json", "md", "html"))
REPORT_STEM = "report"  # report.md and report.html
REPORT_MD = f"{REPORT_STEM}.md"
REPORT_HTML = f"{REPORT_STEM}.html"

REPORTS_ROOT = "reports"  # default parent of run folders, relative to the working directory


def default_run_dir(command: str, model: str, now: datetime.datetime | None = None) -> str:
    """``reports/<command>-<model name>-<YYYYmmdd-HHMMSS>``; the model name made safe for a path; ``-2``, ``-3`` ...
    after it where that folder exists already (a script's second run in the same second). Under torchrun every
    rank names the same folder: none is made here, so ranks that start in the same second agree."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.basename(model.rstrip("/")) or model).strip("-")
    base = os.path.join(REPORTS_ROOT, f"{command}-{name}-{stamp}")
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # another rank may have made it already: the same run's folder
        return base
    taken, path = 1, base
    while os.path.exists(path):
        taken += 1
        path = f"{base}-{taken}"
    return path


def path_in(run_dir: str, name: str) -> str:
    """The path of file ``name`` in ``run_dir``."""
    return os.path.join(run_dir, name)
