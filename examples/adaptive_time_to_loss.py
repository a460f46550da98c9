"""Adaptive accumulation against a fixed effective batch and a fixed ramp: samples, steps and time to one loss.

    python examples/adaptive_time_to_loss.py      # tiny-gpt2, seq 32, E = 64, micro-batch 16, 3 seeds (~10 min)

Each schedule trains the same model on the same data order (gaplan's synthetic corpus, learnable) until its loss,
averaged over the last --window steps, reaches --target:

- ``fixed``: the asked-for effective batch every step (16 x 4);
- ``adaptive``: from --effective-batch-min, doubling when the steps measured at the batch show the noise scale at
  least twice the batch by a confidence bound (``gaplan train --batch-schedule adaptive``, docs/adaptive.md);
- ``warmup:STEPS``: the same doublings at evenly spaced steps, whatever the noise scale.

The micro-batch is the same for all three: only the accumulation steps change. One optimizer for all: AdamW, --lr set
for the asked-for batch, which the schedules scale by the square root of their batch's ratio to it (--lr-scaling).
Prints each schedule's mean samples, steps and seconds to the target with a 95% interval over the seeds (t
distribution); asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from gaplan.data import SyntheticCorpus
from gaplan.plan.schedule import BatchSchedule
from gaplan.plan.split import make_plan
from gaplan.training.loop import TrainConfig, train
from gaplan.workload.build import WorkloadSpec, build_workload

T_975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


class Reached(Exception):
    """The run's smoothed loss reached the target (stops the loop from its step callback)."""


def time_to_loss(schedule: BatchSchedule, seed: int, args: argparse.Namespace) -> dict:
    spec = WorkloadSpec(model=args.model, seq_len=args.seq_len, optimizer="adamw", lr=args.lr)
    workload = build_workload(spec, "cpu", seed=seed)
    corpus = SyntheticCorpus(args.seq_len, seed=seed)
    losses: list[float] = []
    samples = batch = 0
    started = time.perf_counter()

    def on_step(log) -> None:
        nonlocal samples, batch
        losses.append(log.loss)
        samples, batch = samples + log.effective_batch, log.effective_batch
        recent = losses[-args.window:]
        if len(recent) == args.window and sum(recent) / len(recent) <= args.target:
            raise Reached

    config = TrainConfig(steps=args.max_steps, seed=seed, schedule=schedule,
                         lr_scaling=args.lr_scaling if schedule.kind != "fixed" else "none")
    reached = True
    try:
        train(workload, make_plan(args.effective_batch, args.micro_batch), corpus, config, on_step=on_step)
        reached = False
    except Reached:
        pass
    return {"samples": samples, "steps": len(losses), "seconds": time.perf_counter() - started, "reached": reached,
            "last_batch": batch}


def interval(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.1f}"
    half = T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.1f} ({mean - half:.1f}-{mean + half:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gpt2")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--effective-batch", type=int, default=64)
    parser.add_argument("--effective-batch-min", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--warmup-steps", type=int, default=30, help="the warmup ramp's length")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-scaling", default="sqrt", choices=["none", "linear", "sqrt"],
                        help="the schedules' learning rate at a smaller batch (--lr is for --effective-batch)")
    parser.add_argument("--target", type=float, default=3.0, help="the loss to reach (mean of the last --window)")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=400, help="a run that has not reached it by then stops (the "
                        "cosine decay spans these steps)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    schedules = {
        "fixed": BatchSchedule("fixed", args.effective_batch, args.effective_batch),
        "adaptive": BatchSchedule("adaptive", args.effective_batch_min, args.effective_batch),
        f"warmup:{args.warmup_steps}": BatchSchedule("warmup", args.effective_batch_min, args.effective_batch,
                                                     args.warmup_steps),
    }
    print(f"{args.model}, seq {args.seq_len}, effective batch {args.effective_batch} (micro-batch {args.micro_batch}), "
          f"from {args.effective_batch_min} for the schedules; target loss {args.target} (mean of {args.window} "
          f"steps); AdamW lr {args.lr:g}, scaling {args.lr_scaling}; {args.seeds} seeds, {args.threads} threads")
    results: dict[str, list[dict]] = {name: [] for name in schedules}
    for seed in range(args.seeds):  # seeds outermost: a slow moment of the machine falls on every schedule alike
        for name, schedule in schedules.items():
            result = time_to_loss(schedule, seed, args)
            results[name].append(result)
            print(f"  seed {seed} {name:>12}: {result['samples']:>6} samples, {result['steps']:>4} steps, "
                  f"{result['seconds']:6.1f} s, last effective batch {result['last_batch']}"
                  f"{'' if result['reached'] else '  (target not reached)'}", flush=True)
    print(f"\n{'schedule':>12} | {'samples to target':>24} | {'steps':>22} | {'seconds':>22}")
    for name, runs in results.items():
        print(f"{name:>12} | {interval([r['samples'] for r in runs]):>24} | {interval([r['steps'] for r in runs]):>22}"
              f" | {interval([r['seconds'] for r in runs]):>22}")


if __name__ == "__main__":
    main()
