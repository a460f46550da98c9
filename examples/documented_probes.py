"""Re-run the probes whose trials the docs quote, and write what they did to one JSON file.

    python examples/documented_probes.py --json docs/data/probes.json            # all of them (~3 min on 2 cores)
    python examples/documented_probes.py --only seq32-256MiB-plain --json /tmp/p.json

Each probe is a fresh process, as a user runs it: ``gaplan probe ... --threads 1`` for the CLI's, and
``tests/scripts/probe_edges.py loop 512MiB`` for docs/your-loop.md's plain Hugging Face loop, whose B* is then
trained in a new process under ``gaplan.cpu_budget`` and B*+1 run out of memory there (exit 0 and 3).

The file holds, per probe: the command, the budget the trials ran under, the search cap, every trial (micro-batch,
fits, peaks, steps, seconds), B*, and when and where it ran. ``tests/test_docs_numbers.py`` replays the search
(``gaplan.plan.search.find_edge``) on the recorded peaks, checks that it asks for the same trials in the same
order, and checks that the docs quote the file: a change to the search, or a doc left behind, fails there.
The edges themselves move by a sample from machine to machine (the CPU budget's address layout): re-run this
script, then ``python tests/test_docs_numbers.py --write`` to re-render the docs' tables.
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
SCRIPTS = os.path.join(ROOT, "tests", "scripts")

# name -> gaplan probe's options (each run adds --threads 1 --quiet --out TMP); "loop" is probe_loop's.
CLI_PROBES = {
    "default-seeded": [],
    "default-plain": ["--no-seed-from-estimate"],
    "seq16-256MiB-seeded": ["--seq-len", "16", "--memory-limit", "256MiB"],
    "seq32-256MiB-plain": ["--seq-len", "32", "--memory-limit", "256MiB", "--no-seed-from-estimate"],
}
LOOP = "loop-512MiB"
TRIAL_FIELDS = ("micro_batch", "fits", "peak_bytes", "micro_steps_peak_bytes", "completed_steps", "seconds")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def trials_of(result: dict) -> list[dict]:
    return [{name: trial.get(name) for name in TRIAL_FIELDS} for trial in result["trials"]]


def cli_probe(options: list[str], threads: int) -> dict:
    from gaplan.plan.split import default_search_cap

    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "gaplan", "probe", *options, "--threads", str(threads), "--quiet",
                   "--out", out]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"gaplan probe {' '.join(options)} failed:\n{done.stderr[-2000:]}")
        with open(os.path.join(out, "plan.json")) as file:
            result = json.load(file)
    return {"command": " ".join(["gaplan probe", *options, "--threads", str(threads)]),
            "limit_bytes": result["probe_limit_bytes"],
            "search_cap": default_search_cap(result["plan"]["effective_batch"], result["world_size"]),
            "trials": trials_of(result), "edge": result["max_micro_batch"],
            "wall_seconds": round(result["wall_seconds"], 2)}


def loop_probe() -> dict:
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "probe_edges.py"), "loop", "512MiB"], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"probe_edges.py loop failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    edge = result["max_micro_batch"]
    fresh = {}
    for micro_batch in (edge, edge + 1):  # 0: trains two optimizer steps; 3: out of memory
        check = subprocess.run([sys.executable, os.path.join(SCRIPTS, "plain_hf_loop.py"), str(micro_batch), "512MiB"],
                               cwd=ROOT, capture_output=True, text=True)
        fresh[str(micro_batch)] = {0: "trains", 3: "OOM"}.get(check.returncode, f"exit {check.returncode}")
    return {"command": "python tests/scripts/probe_edges.py loop 512MiB", "limit_bytes": result["memory_limit_bytes"],
            "search_cap": 64, "trials": trials_of(result), "edge": edge,
            "wall_seconds": round(result["wall_seconds"], 2), "fresh_process": fresh}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, metavar="PATH", help="write the probes here")
    parser.add_argument("--only", action="append", choices=[*CLI_PROBES, LOOP],
                        help="this probe only (repeatable); the file keeps the others it already has")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the CLI's probes (default 1)")
    args = parser.parse_args()
    import torch
    import transformers

    previous = {}
    if args.only and os.path.exists(args.json):
        with open(args.json) as file:
            previous = json.load(file)["probes"]
    probes = dict(previous)
    for name in args.only or [*CLI_PROBES, LOOP]:
        probes[name] = loop_probe() if name == LOOP else cli_probe(CLI_PROBES[name], args.threads)
        probes[name]["date"] = datetime.date.today().isoformat()
        sequence = " ".join(f"{t['micro_batch']}{'' if t['fits'] else 'x'}" for t in probes[name]["trials"])
        print(f"{name}: B* = {probes[name]['edge']}, trials {sequence}", flush=True)
    data = {"made_by": "python examples/documented_probes.py --json " + os.path.relpath(args.json, ROOT),
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "transformers": transformers.__version__},
            "probes": {name: probes[name] for name in sorted(probes)}}
    with open(args.json, "w") as file:
        json.dump(data, file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    main()
