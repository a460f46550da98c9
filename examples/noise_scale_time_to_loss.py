"""The effective batch you asked for against the one the measured noise scale suggests: time to the same loss.

    python examples/noise_scale_time_to_loss.py        # tiny-gpt2, seq 64, E = 64 (8 x 8) for 40 steps (~1 min)

Trains the asked-for batch, reads the noise scale it measured and the batch that `gaplan train` suggests (the power
of two nearest it), then trains that batch until its loss, averaged over 10 steps as the other's, reaches the
asked-for run's last one. Prints each run's wall time and samples to that loss. Same optimizer and learning rate
(AdamW, 1e-3): gaplan does not rescale it. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

from gaplan.plan.goodput import balanced_batch

COMMON = ["--model", "tiny-gpt2", "--seq-len", "64", "--threads", "2", "--device", "cpu", "--quiet"]
WINDOW = 10


def train(folder: str, effective: int, micro: int, steps: int) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "gaplan", "train", *COMMON, "--effective-batch", str(effective),
                           "--micro-batch", str(micro), "--steps", str(steps), "--out", folder, "--json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gaplan train failed:\n{done.stderr[-2000:]}")
    with open(os.path.join(folder, "train_log.csv")) as handle:
        return [{**row, "summary": json.loads(done.stdout)} for row in csv.DictReader(handle)]


def smoothed(rows: list[dict]) -> list[float]:
    losses = [float(r["loss"]) for r in rows]
    return [sum(losses[max(0, i - WINDOW + 1):i + 1]) / len(losses[max(0, i - WINDOW + 1):i + 1])
            for i in range(len(losses))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effective-batch", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asked = train(os.path.join(tmp, "asked"), args.effective_batch, args.micro_batch, args.steps)
        measured = asked[-1]["summary"]["noise_scale"]
        if not measured:
            raise SystemExit("the asked-for run measured no noise scale (one micro-batch per step?)")
        noise, target = measured["noise_scale"], smoothed(asked)[-1]
        other = balanced_batch(noise)
        wall = sum(float(r["seconds"]) for r in asked)
        print(f"asked: effective batch {args.effective_batch}, {args.steps} steps, {wall:.1f} s, "
              f"{args.effective_batch * args.steps} samples, loss (last {WINDOW} steps) {target:.3f}")
        print(f"measured noise scale ~{noise:.1f} samples: {measured['summary']}")
        budget = min(600, 2 * args.effective_batch * args.steps // other)  # up to twice the asked-for samples
        rows = train(os.path.join(tmp, "suggested"), other, min(other, args.micro_batch), budget)
        seconds = 0.0
        for index, (row, value) in enumerate(zip(rows, smoothed(rows), strict=True)):
            seconds += float(row["seconds"])
            if index + 1 >= WINDOW and value <= target:
                print(f"suggested: effective batch {other} reaches it at step {row['step']}, {seconds:.1f} s, "
                      f"{other * int(row['step'])} samples: {seconds / wall:.0%} of the time, "
                      f"{other * int(row['step']) / (args.effective_batch * args.steps):.0%} of the samples")
                return
        print(f"suggested: effective batch {other} did not reach {target:.3f} in {budget} steps ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
