"""Measure what selective checkpointing and --compile buy in B* and cost in time on this CPU, into one JSON file.

    python examples/levers_cpu.py --json docs/data/levers.json     # ~10 min on 2 shared cores

tiny-gpt2 at seq 64, one thread. For --grad-checkpointing off, every:2 and on: ``gaplan probe`` under a 256 MiB
budget (B*, a fresh process each, as a user runs it). For those and --compile: one unbounded trial at micro-batch 8
with 3 optimizer steps in the probe's worker (peak bytes; the last step's wall and CPU seconds, after the compile
that the first step pays). ``tests/test_docs_numbers.py`` renders docs/levers.md's table from the file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEQ_LEN, BUDGET, MICRO_BATCH, EFFECTIVE = 64, "256MiB", 8, 64
CHECKPOINTING = ("off", "every:2", "on")


def probe_edge(checkpointing: str) -> dict:
    options = ["--seq-len", str(SEQ_LEN), "--memory-limit", BUDGET, "--effective-batch", str(EFFECTIVE),
               "--grad-checkpointing", checkpointing, "--threads", "1"]
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-m", "gaplan", "probe", *options, "--quiet", "--out", out], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"gaplan probe {' '.join(options)} failed:\n{done.stderr[-2000:]}")
        with open(os.path.join(out, "plan.json")) as file:
            result = json.load(file)
    return {"command": " ".join(["gaplan probe", *options]), "edge": result["max_micro_batch"]}


def fixed_trial(checkpointing: str, compile_: bool) -> dict:
    from gaplan.core.checkpointing import parse_checkpointing
    from gaplan.worker.client import WorkerProcess
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=SEQ_LEN, grad_checkpointing=parse_checkpointing(checkpointing),
                        compile=compile_)
    with WorkerProcess(spec, "cpu", 2 * 2**30, threads=1) as worker:
        trial = worker.trial(MICRO_BATCH, optimizer_steps=3, unbounded=True)
    if not trial.fits:
        sys.exit(f"the trial of {spec} failed: {trial.error}")
    return {"peak_bytes": trial.peak_bytes, "step_seconds": [round(s, 3) for s in trial.step_seconds],
            "step_cpu_seconds": [round(s, 3) for s in trial.step_cpu_seconds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where to write the measurements")
    args = parser.parse_args()
    import torch

    rows = {}
    for checkpointing in CHECKPOINTING:
        rows[checkpointing] = {**probe_edge(checkpointing), **fixed_trial(checkpointing, False)}
        print(checkpointing, rows[checkpointing], flush=True)
    rows["compile"] = fixed_trial("off", True)
    print("compile", rows["compile"], flush=True)
    with open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                   platform.processor())
    data = {"model": "tiny-gpt2", "seq_len": SEQ_LEN, "budget": BUDGET, "micro_batch": MICRO_BATCH, "rows": rows,
            "date": datetime.date.today().isoformat(), "made_by": "python examples/levers_cpu.py --json " + args.json,
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__.split("+")[0],
                        "shared": True}}
    with open(args.json, "w") as file:
        json.dump(data, file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    main()
