"""What measuring the gradient noise scale costs `gaplan train`: step time and step peak, with and without it.

    python examples/noise_scale_overhead.py            # tiny-gpt2, seq 128, 8 x 4, 2 threads (~4 min)
    python examples/noise_scale_overhead.py --rounds 9 --pairs 60

Two measurements of the step time:
* ``gaplan train`` as a user runs it: each round trains once with ``--noise-scale`` and once with ``--no-noise-scale``,
  each a fresh process, in an order that alternates from round to round; a run's step time is the median of its steps
  after the first two. The ratio is taken round by round (gaplan.benchmark.stats: geometric mean and 95% interval).
  Fresh processes differ by a few percent from one another, so this interval is wide.
* The step the loop runs (``gaplan.training.optimizer_step``) in one process, alternating step by step between the
  meter attached and not, paired step by step: the meter's own cost, to a narrow interval.

The peaks come from one run of each under ``--enforce-memory-limit``, where the step peak is exact (the probe's
measure). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile

COMMON = ["--model", "tiny-gpt2", "--seq-len", "128", "--micro-batch", "8", "--effective-batch", "32", "--threads", "2",
          "--device", "cpu", "--quiet"]


def run(folder: str, noise: bool, steps: int, *extra: str) -> list[dict]:
    flag = "--noise-scale" if noise else "--no-noise-scale"
    done = subprocess.run([sys.executable, "-m", "gaplan", "train", *COMMON, "--steps", str(steps), flag, "--out", folder,
                           *extra], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gaplan train failed:\n{done.stderr[-2000:]}")
    with open(os.path.join(folder, "train_log.csv")) as handle:
        return list(csv.DictReader(handle))


def in_process(pairs: int) -> tuple[list[float], list[float], float]:
    """Step times with and without the meter, alternating step by step in this process (the order flips each pair),
    and the seconds spent inside the meter's own calls (its hooks, its per-micro-step sums, its step reading)."""
    import time

    import torch

    from gaplan.parallel.process_group import init_distributed
    from gaplan.training.noise_scale import NoiseScaleMeter
    from gaplan.training.optimizer_step import optimizer_step
    from gaplan.workload.build import WorkloadSpec, build_workload

    inside = [0.0]

    def timed(method):
        def call(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - started
        return call

    class TimedMeter(NoiseScaleMeter):  # the same meter; each of its calls timed
        _add = timed(NoiseScaleMeter._add)
        start_micro_step = timed(NoiseScaleMeter.start_micro_step)
        end_micro_step = timed(NoiseScaleMeter.end_micro_step)
        finish = timed(NoiseScaleMeter.finish)

    torch.set_num_threads(2)
    torch.manual_seed(0)
    workload = build_workload(WorkloadSpec(model="tiny-gpt2", seq_len=128), "cpu")
    dist = init_distributed("cpu")
    batches = [workload.make_batch(8) for _ in range(4)]
    times: dict[bool, list[float]] = {True: [], False: []}

    def step(measure: bool) -> float:
        meter = TimedMeter(workload.model) if measure else None
        started = time.perf_counter()
        optimizer_step(workload, workload.model, batches, dist, None, None, noise=meter)
        seconds = time.perf_counter() - started
        if meter is not None:
            meter.close()
        return seconds

    for _ in range(3):  # warm-up: the optimizer's states, MKL's first products
        step(True), step(False)
    inside[0] = 0.0
    for index in range(pairs):
        for measure in ((True, False) if index % 2 == 0 else (False, True)):
            times[measure].append(step(measure))
    return times[True], times[False], inside[0]


def main() -> None:
    from gaplan.benchmark.stats import paired_ratio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=40, help="step pairs of the one-process measurement")
    args = parser.parse_args()
    if args.rounds < 2 or args.steps < 3 or args.pairs < 2:
        parser.error("--rounds and --pairs must be 2 or more (a ratio's interval needs two pairs), --steps 3 or more "
                     "(a run's step time leaves its first two steps out)")
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            for noise in ((True, False) if index % 2 == 0 else (False, True)):
                rows = run(os.path.join(tmp, f"{index}-{noise}"), noise, args.steps)
                times[noise].append(statistics.median(float(r["seconds"]) for r in rows[2:]))
            print(f"round {index + 1}: with {times[True][-1]:.3f} s/step, without {times[False][-1]:.3f} s/step",
                  flush=True)
        peaks = {noise: max(int(r["step_peak_bytes"]) for r in run(os.path.join(tmp, f"peak-{noise}"), noise, 4,
                                                                  "--enforce-memory-limit", "--memory-limit", "2GiB"))
                 for noise in (True, False)}
    ratio = paired_ratio(times[True], times[False])
    print(f"\ngaplan train, step time with / without the measurement: {ratio.value:.3f}x (95% CI {ratio.low:.3f}-"
          f"{ratio.high:.3f}), medians {statistics.median(times[True]):.3f} s vs {statistics.median(times[False]):.3f} s")
    with_meter, without, inside = in_process(args.pairs)
    ratio = paired_ratio(with_meter, without)
    print(f"one process, {args.pairs} step pairs, with / without the meter: {ratio.value:.4f}x (95% CI "
          f"{ratio.low:.4f}-{ratio.high:.4f}), medians {statistics.median(with_meter):.3f} s vs "
          f"{statistics.median(without):.3f} s")
    print(f"inside the meter's own calls: {1000 * inside / len(with_meter):.2f} ms a step, "
          f"{inside / sum(with_meter):.2%} of the steps' time")
    print(f"step peak with / without: {peaks[True] / 2**20:.2f} MiB vs {peaks[False] / 2**20:.2f} MiB "
          f"({(peaks[True] - peaks[False]) / peaks[False]:+.2%})")


if __name__ == "__main__":
    main()
