"""Where a probe's wall time goes: the worker's start, and each trial's fork, budget, build, steps and report back.

    python examples/profile_probe.py                                  # tiny-gpt2, seq 128, 1 GiB (the default workload)
    python examples/profile_probe.py --seq-len 32 --memory-limit 256MiB   # a cheap one (compare_with_peers --quick)
    python examples/profile_probe.py --json                           # the numbers, machine-readable
    python examples/profile_probe.py --seq-len 32 --memory-limit 256MiB --threads 1 --json docs/data/profile_probe.json
                                      # the table and the file docs/comparison.md renders "where a probe's time goes" from

The probe runs in a fresh Python process (this script again, with ``--child``), as ``gaplan probe`` and
``compare_with_peers.py`` run it; the CLI's own start (``python -m gaplan --help``) is timed apart. The trial
phases come from the worker (``Trial.phase_seconds``): "fork" is from the worker's fork to the child running,
"in the worker" the child's whole life, and "round trip" what the caller waited for the trial.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

PHASES = ("fork", "budget", "model build", "optimizer states", "step 1", "step 2")


def child(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    from gaplan import WorkloadSpec, probe
    from gaplan.core.units import parse_bytes

    imported = time.perf_counter()
    arrivals: list[float] = []
    result = probe(WorkloadSpec(model=args.model, seq_len=args.seq_len), device="cpu",
                   memory_limit=parse_bytes(args.memory_limit), threads=args.threads or None,
                   on_trial=lambda trial: arrivals.append(time.perf_counter()))
    waited = [later - earlier for earlier, later in zip([imported, *arrivals[:-1]], arrivals, strict=True)]
    start = result.worker_seconds or {}
    trials = []
    for trial, seconds in zip(result.trials, waited, strict=True):
        phases = trial.phase_seconds or {}
        trials.append({"micro_batch": trial.micro_batch, "fits": trial.fits, "steps": trial.completed_steps,
                       **{name: phases.get(name) for name in PHASES}, "in the worker": phases.get("in the worker"),
                       "round trip": round(seconds, 3)})
    trials[0]["round trip"] = round(trials[0]["round trip"] - start.get("start to ready", 0.0), 3)
    return {"edge": result.max_micro_batch, "import gaplan": round(imported - started, 3), "worker": start,
            "trials": trials, "probe wall": round(result.wall_seconds, 3),
            "process wall": round(time.perf_counter() - started, 3)}


def cli_start() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gaplan", "--help"], capture_output=True, check=True)
    return round(time.perf_counter() - started, 3)


def print_profile(profile: dict) -> None:
    def cell(value) -> str:
        return "-" if value is None else f"{value:.2f}"

    print(f"CLI start (python -m gaplan --help)   {profile['cli start']:.2f} s")
    print(f"import gaplan (the caller)            {profile['import gaplan']:.2f} s")
    for name, seconds in profile["worker"].items():
        print(f"worker: {name:<30} {seconds:.2f} s")
    header = ["micro-batch", "fits", "steps", *PHASES, "in the worker", "round trip"]
    print()
    print("  ".join(f"{h:>11}" for h in header))
    for row in profile["trials"]:
        values = [str(row["micro_batch"]), "yes" if row["fits"] else "OOM", str(row["steps"]),
                  *(cell(row[name]) for name in PHASES), cell(row["in the worker"]), cell(row["round trip"])]
        print("  ".join(f"{v:>11}" for v in values))
    trials = profile["trials"]
    steps = sum((row["step 1"] or 0) + (row["step 2"] or 0) for row in trials)
    print()
    print(f"B* = {profile['edge']} in {len(trials)} trials; probe {profile['probe wall']:.2f} s, process "
          f"{profile['process wall']:.2f} s, of which the measured steps {steps:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-gpt2")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per trial (0: torch's default)")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                        help="the profile as JSON: on stdout, or written to PATH (with the date, the machine and the "
                             "command) while the table is printed")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    command = [sys.executable, __file__, "--child", "--model", args.model, "--seq-len", str(args.seq_len),
               "--memory-limit", args.memory_limit, "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the probe failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    profile = {"cli start": cli_start(), **json.loads(done.stdout.strip().splitlines()[-1])}
    if args.json == "-":
        print(json.dumps(profile, indent=2))
        return
    print_profile(profile)
    if args.json:
        import datetime
        import os
        import platform

        import torch

        command = ["python examples/profile_probe.py", "--model", args.model, "--seq-len", str(args.seq_len),
                   "--memory-limit", args.memory_limit, "--threads", str(args.threads),
                   "--json", os.path.relpath(args.json)]
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown")
        profile = {"made_by": " ".join(command), "date": datetime.date.today().isoformat(),
                   "machine": {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                               "torch": torch.__version__},
                   **profile}
        with open(args.json, "w") as file:
            json.dump(profile, file, indent=1)
            file.write("\n")


if __name__ == "__main__":
    main()
