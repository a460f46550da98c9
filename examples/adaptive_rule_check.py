"""The adaptive schedule's rule on problems whose noise scale is known: where it stops, how often it grows too far,
and how long it takes to grow.

    python examples/adaptive_rule_check.py                  # both tables (~6 minutes on 2 cores)
    python examples/adaptive_rule_check.py --part replay    # the replay alone (~1 minute)

The problem is linear regression held at fixed weights (``tests/training/linear_regression.py``): its gradient noise
scale is ``B_noise = d + 1 + d s^2 / |D|^2`` exactly, at every step. Each run is ``gaplan.train`` with
``--batch-schedule adaptive`` and SGD at a learning rate of 1e-12 (the weights stay, so the noise scale does too).

- ``replay``: from 2 to 64, at the known noise scales 3, 17 and 23, 20 seeds each (0-19), 300 and 120 steps. The
  rule's level is the first E of the doublings with ``2 E >= B_noise`` (it doubles only while ``B_noise > 2 E``):
  it should stop there.
- ``rates``: one doubling, from E to 2E, at noise scales ``r x 2E`` for margins r below and above 1, --seeds seeds
  each: the share of runs that doubled within --steps steps (a false growth where r < 1) and the median steps it took.
  At E = 2 (two micro-batches of one sample, the hardest case) and E = 8.

Prints Markdown tables; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo: tests.training

from gaplan.plan.schedule import BatchSchedule  # noqa: E402
from gaplan.plan.split import make_plan  # noqa: E402
from gaplan.training.loop import TrainConfig, train  # noqa: E402
from gaplan.workload.build import WorkloadSpec, build_workload  # noqa: E402
from tests.training import linear_regression  # noqa: E402


def batches(dim: int, noise_std: float, minimum: int, maximum: int, steps: int, seed: int) -> list[int]:
    """The effective batch of each step of one adaptive run on the regression (``dim``, ``noise_std``)."""
    linear_regression.chosen = functools.partial(linear_regression.workload, dim, noise_std)
    spec = WorkloadSpec(model="tests.training.linear_regression:chosen", optimizer="sgd", lr=1e-12)
    workload = build_workload(spec, "cpu", seed=seed)
    schedule = BatchSchedule("adaptive", minimum=minimum, maximum=maximum)
    result = train(workload, make_plan(maximum, maximum), None, TrainConfig(steps=steps, seed=seed, schedule=schedule))
    return [log.effective_batch for log in result.logs]


def rule_level(noise_scale: float, minimum: int, maximum: int) -> int:
    """The level the rule should stop at: the first doubling E from ``minimum`` with ``2 E >= noise_scale`` (the rule
    doubles only while ``noise_scale > 2 E``), or ``maximum``."""
    level = minimum
    while level * 2 <= maximum and noise_scale > 2 * level:
        level *= 2
    return level


def replay(seeds: int, step_counts: list[int]) -> list[dict]:
    rows = []
    for steps in step_counts:
        for scale, (dim, noise_std) in linear_regression.SCALES.items():
            finals = [batches(dim, noise_std, 2, 64, steps, seed)[-1] for seed in range(seeds)]
            level = rule_level(scale, 2, 64)
            rows.append({"steps": steps, "noise_scale": scale, "rule_level": level, "seeds": seeds,
                         "past": sum(final > level for final in finals),
                         "reached": sum(final >= level for final in finals),
                         "finals": dict(sorted(collections.Counter(finals).items()))})
            print(f"  replay: {steps} steps, B_noise {scale}: {rows[-1]['finals']}", file=sys.stderr, flush=True)
    return rows


def rates(seeds: int, steps: int, margins: list[float]) -> list[dict]:
    rows = []
    for level, dim in ((2, 2), (8, 8)):
        for margin in margins:
            scale = margin * 2 * level
            noise_std = math.sqrt(max(0.0, (scale - dim - 1) / dim))  # B_noise = d + 1 + d s^2
            if abs(linear_regression.noise_scale(dim, noise_std) - scale) > 1e-9:
                continue  # below d + 1: not reachable with this dimension
            grew_at = []
            for seed in range(seeds):
                run = batches(dim, noise_std, level, 2 * level, steps, 1000 + seed)
                grew_at.append(run.index(2 * level) if 2 * level in run else None)
            grown = [s for s in grew_at if s is not None]
            rows.append({"level": level, "margin": margin, "noise_scale": scale, "seeds": seeds, "steps": steps,
                         "grew": len(grown), "median_steps": statistics.median(grown) if grown else None})
            print(f"  rates: E {level}, r {margin}: {len(grown)}/{seeds}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["replay", "rates", "both"], default="both")
    parser.add_argument("--seeds", type=int, default=100, help="seeds per margin in the rates (default 100)")
    parser.add_argument("--steps", type=int, default=300, help="steps per run in the rates (default 300)")
    parser.add_argument("--margins", default="0.75,1,1.3,1.5,2,3", help="B_noise / 2E in the rates")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the numbers here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out: dict = {"torch": torch.__version__}
    if args.part in ("replay", "both"):
        out["replay"] = replay(20, [300, 120])
        print("| steps | known B_noise | the rule stops at | runs that went past it | reached it | final E over the "
              "20 seeds |\n|--:|--:|--:|--:|--:|---|")
        for row in out["replay"]:
            finals = ", ".join(f"{k}: {v}" for k, v in row["finals"].items())
            print(f"| {row['steps']} | {row['noise_scale']} | {row['rule_level']} | {row['past']} of {row['seeds']} | "
                  f"{row['reached']} of {row['seeds']} | {finals} |")
    if args.part in ("rates", "both"):
        margins = [float(m) for m in args.margins.split(",")]
        out["rates"] = rates(args.seeds, args.steps, margins)
        print(f"\n| E | B_noise / 2E | B_noise | doubled within {args.steps} steps | median steps to double |"
              "\n|--:|--:|--:|--:|--:|")
        for row in out["rates"]:
            median = "-" if row["median_steps"] is None else f"{row['median_steps']:g}"
            print(f"| {row['level']} | {row['margin']:g} | {row['noise_scale']:g} | {row['grew']} of {row['seeds']} "
                  f"| {median} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(out, handle, indent=1)
            handle.write("\n")


if __name__ == "__main__":
    main()
