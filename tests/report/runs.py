"""Hand-written run folders for the report tests: plan.json and the CSVs as probe, bench and train write them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pandas as pd

MIB = 2**20
BUDGET = 2**30
STATIC = 88_301_568
PER_SAMPLE = 53 * MIB // 2  # 26.5 MiB a sample: B* = 35 under 1 GiB (36 does not fit)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CPU_OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes. Error code 12 (Cannot all"


def micro_peak(micro_batch: int) -> int:
    return STATIC + PER_SAMPLE * micro_batch


def trial(micro_batch: int, fits: bool) -> dict:
    if not fits:
        return {"micro_batch": micro_batch, "fits": False, "peak_bytes": None, "seconds": 3.9, "error": CPU_OOM,
                "completed_steps": 0, "micro_steps_peak_bytes": None}
    # The optimizer step adds a little on top of the forward/backward peak.
    return {"micro_batch": micro_batch, "fits": True, "peak_bytes": micro_peak(micro_batch) + 4 * MIB, "seconds": 0.7,
            "error": None, "completed_steps": 2, "micro_steps_peak_bytes": micro_peak(micro_batch)}


TRIALS = [trial(1, True), trial(4, True), trial(16, True), trial(64, False), trial(32, True), trial(36, False), trial(35, True)]


def plan_json(trials: list[dict]) -> dict:
    return {
        "gaplan_version": "0.1.0", "torch_version": "2.13.0+cpu", "created": "2026-11-29T08:22:21+00:00",
        "workload": {"model": "tiny-gpt2", "task": None, "seq_len": None, "dtype": "fp32", "optimizer": "adamw",
                     "lr": 0.0001, "grad_checkpointing": False},
        "device": "cpu", "memory_limit_bytes": BUDGET, "margin": 0.0, "probe_limit_bytes": BUDGET, "budget_is_default": True,
        "max_micro_batch": 35, "capped": False, "trials": trials,
        "plan": {"effective_batch": 256, "micro_batch": 32, "grad_accum_steps": 8, "micro_batch_sizes": [32] * 8,
                 "world_size": 1, "max_micro_batch": 35},
        "param_count": 5_518_848, "static_bytes": STATIC, "task": "causal-lm", "seq_len": 128, "wall_seconds": 39.2,
        "tuner": {"objective": "throughput", "micro_batch": 16, "grad_checkpointing": False,
                  "reason": "16 x 16 measured 18.2 samples/s, 4% above the largest micro-batch"},
    }


def unprobed_plan_json(memory_limit: int | None = None) -> dict:
    """A plan made with ``--micro-batch 8`` (no probe), as ``ProbeResult.to_dict`` writes it."""
    data = plan_json([])
    data.update(probed=False, memory_limit_bytes=memory_limit, probe_limit_bytes=memory_limit,
                budget_is_default=memory_limit is None, max_micro_batch=8, static_bytes=None, wall_seconds=0.0,
                tuner=None, command="gaplan train --micro-batch 8 --effective-batch 32 --compare")
    data["workload"]["task"] = "causal-lm"
    data["plan"] = {"effective_batch": 32, "micro_batch": 8, "grad_accum_steps": 4, "micro_batch_sizes": [8] * 4,
                    "world_size": 1, "max_micro_batch": 8}
    return data


def throughput_rows() -> list[dict]:
    large = 15.0

    def row(split: str, kind: str, micro: int, steps: int, speed: float, bounded: bool = True, note: str = "") -> dict:
        fits = bounded
        peak = micro_peak(micro) + 4 * MIB
        return {"split": split, "kind": kind, "micro_batch": micro, "grad_accum_steps": steps, "effective_batch": micro * steps,
                "repeats": 3, "step_seconds_median": micro * steps / speed, "step_seconds_min": micro * steps / speed * 0.98,
                "step_seconds_max": micro * steps / speed * 1.03, "samples_per_s": speed, "tokens_per_s": speed * 128,
                "peak_bytes": peak, "fits_budget": fits, "bounded": bounded, "ratio_to_large_batch": speed / large,
                "note": note}

    return [row("plan", "plan", 32, 8, 17.5), row("16x16", "split", 16, 16, 18.2, note="tuner pick"),
            row("8x32", "split", 8, 32, 14.1), row("256x1", "large-batch", 256, 1, 15.0, bounded=False,
                                                   note="measured without the budget")]


def breakdown_rows() -> list[dict]:
    rows = []
    for micro in (1, 16, 32):
        parts = {"parameters": 22_075_392, "gradients": 22_075_392, "optimizer_states": 44_150_784,
                 "activations": 26 * MIB * micro, "other": 3 * MIB}
        tracked = sum(parts.values())
        rows.append({"micro_batch": micro, **parts, "tracked_total": tracked, "device_peak_bytes": tracked + 6 * MIB})
    return rows


def train_log_rows(losses: tuple[float, ...] = (10.9, 9.8, 8.7, 7.9, 7.2, 6.8)) -> list[dict]:
    return [{"step": step, "loss": loss, "lr": 1e-4, "samples_per_s": 17.0 + step * 0.1,
             "tokens_per_s": (17.0 + step * 0.1) * 128, "peak_bytes": micro_peak(32) + 4 * MIB if step > 1 else None,
             "micro_batch": 32, "grad_accum_steps": 8,
             "seconds": 14.6} for step, loss in enumerate(losses, start=1)]


def make_run(directory: Path, full: bool = True, plan: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "plan.json").write_text(json.dumps(plan or plan_json(TRIALS), indent=2))
    if full:
        pd.DataFrame(throughput_rows()).to_csv(directory / "throughput.csv", index=False)
        pd.DataFrame(breakdown_rows()).to_csv(directory / "breakdown.csv", index=False)
        pd.DataFrame(train_log_rows()).to_csv(directory / "train_log.csv", index=False)
    return directory


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height
