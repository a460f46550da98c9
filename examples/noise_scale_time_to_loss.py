"""The effective batch you asked for against the one `gaplan probe --objective goodput` chooses: time to one loss.

    python examples/noise_scale_time_to_loss.py        # tiny-gpt2, seq 64, E = 64 asked, range 4:128 (~4 min)

1. `gaplan probe --objective goodput` probes B*, measures the noise scale in a short run at the asked-for batch, times
   the plans of the range and writes the plan of the best goodput (samples/s x statistical efficiency).
2. The asked-for batch trains (at B*, as gaplan would plan it) for --steps steps.
3. The chosen plan trains (`gaplan train --plan`) until its loss, averaged over 10 steps as the other's, reaches the
   asked-for run's last one.

Prints each run's wall time and samples to that loss. Same optimizer and learning rate (AdamW, 1e-3): gaplan does not
rescale it unless asked (--lr-scaling). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

COMMON = ["--model", "tiny-gpt2", "--seq-len", "64", "--threads", "2", "--device", "cpu", "--quiet"]
WINDOW = 10


def gaplan(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "gaplan", *args, *COMMON, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gaplan {args[0]} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def train(folder: str, *args: str) -> list[dict]:
    gaplan("train", *args, "--out", folder)
    with open(os.path.join(folder, "train_log.csv")) as handle:
        return list(csv.DictReader(handle))


def smoothed(rows: list[dict]) -> list[float]:
    losses = [float(r["loss"]) for r in rows]
    return [sum(losses[max(0, i - WINDOW + 1):i + 1]) / len(losses[max(0, i - WINDOW + 1):i + 1])
            for i in range(len(losses))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effective-batch", type=int, default=64)
    parser.add_argument("--batch-range", default="4:128")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--measure-steps", type=int, default=20)
    parser.add_argument("--memory-limit", default="512MiB")
    args = parser.parse_args()
    asked_batch = args.effective_batch
    with tempfile.TemporaryDirectory() as tmp:
        probed = gaplan("probe", "--objective", "goodput", "--effective-batch", str(asked_batch), "--batch-range",
                        args.batch_range, "--measure-steps", str(args.measure_steps), "--memory-limit",
                        args.memory_limit, "--out", os.path.join(tmp, "probe"))
        goodput = probed["tuner"]["goodput"]
        chosen = probed["plan"]["effective_batch"]
        print(f"B* {probed['max_micro_batch']}; noise scale ~{goodput['noise_scale']:.1f} samples, measured in "
              f"{args.measure_steps} steps at {asked_batch}")
        print(f"{'effective batch':>15} {'samples/s':>10} {'efficiency':>10} {'goodput':>8}")
        for row in sorted(goodput["rows"], key=lambda r: r["effective_batch"]):
            mark = "  <- chosen" if row["effective_batch"] == chosen else "  <- asked" if row[
                "effective_batch"] == asked_batch else ""
            print(f"{row['effective_batch']:>15} {row['samples_per_s']:>10.1f} {row['efficiency']:>10.2f} "
                  f"{row['goodput']:>8.1f}{mark}")
        micro = str(min(asked_batch, probed["max_micro_batch"]))
        asked = train(os.path.join(tmp, "asked"), "--effective-batch", str(asked_batch), "--micro-batch", micro,
                      "--steps", str(args.steps))
        target = smoothed(asked)[-1]
        wall = sum(float(r["seconds"]) for r in asked)
        print(f"asked: effective batch {asked_batch}, {args.steps} steps, {wall:.1f} s, {asked_batch * args.steps} "
              f"samples, loss (last {WINDOW} steps) {target:.3f}")
        if chosen == asked_batch:
            print("chosen: the asked-for batch itself")
            return
        budget = min(600, 2 * asked_batch * args.steps // chosen)  # up to twice the asked-for samples
        rows = train(os.path.join(tmp, "chosen"), "--plan", os.path.join(tmp, "probe", "plan.json"), "--steps",
                     str(budget))
        seconds = 0.0
        for index, (row, value) in enumerate(zip(rows, smoothed(rows), strict=True)):
            seconds += float(row["seconds"])
            if index + 1 >= WINDOW and value <= target:
                print(f"chosen: effective batch {chosen} reaches it at step {row['step']}, {seconds:.1f} s, "
                      f"{chosen * int(row['step'])} samples: {seconds / wall:.0%} of the time, "
                      f"{chosen * int(row['step']) / (asked_batch * args.steps):.0%} of the samples")
                return
        print(f"chosen: effective batch {chosen} did not reach {target:.3f} in {budget} steps ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
