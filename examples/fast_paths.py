"""Time gaplan's fast paths in two source trees, alternating, so a refactor can show it made none slower.

    git worktree add /tmp/before <commit>
    python examples/fast_paths.py /tmp/before . --repeats 3 --json before-after.json     # ~5 min on 2 cores

Each tree runs the same commands in a fresh interpreter (``PYTHONPATH=<tree> python -m gaplan ...``), one tree after
the other, ``--repeats`` times, so a load that comes and goes falls on both:

* ``import``: ``python -c "import gaplan.cli.main"``;
* ``help``: ``gaplan train --help`` (the import of one command and its options, built from its fields);
* ``estimate``: ``gaplan estimate`` on tiny-gpt2 at seq 64 (the trace on fake tensors);
* ``probe``: ``gaplan probe`` on tiny-gpt2 at seq 16 under 256 MiB, one thread, without the estimate's seed;
* ``train``: ``gaplan train`` for 8 steps of 16 samples in micro-batches of 4 (the accumulated loop), one thread.

It prints the median wall seconds of each in each tree and their ratio (the second tree's over the first's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "import": ["-c", "import gaplan.cli.main"],
    "help": ["-m", "gaplan", "train", "--help"],
    "estimate": ["-m", "gaplan", "estimate", "--seq-len", "64", "--threads", "1", "--json"],
    "probe": ["-m", "gaplan", "probe", "--seq-len", "16", "--memory-limit", "256MiB", "--threads", "1",
              "--no-seed-from-estimate", "--quiet", "--out", "{out}"],
    "train": ["-m", "gaplan", "train", "--seq-len", "16", "--effective-batch", "16", "--micro-batch", "4", "--steps",
              "8", "--threads", "1", "--quiet", "--out", "{out}"],
}


def timed(tree: str, args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable, *(a.replace("{out}", os.path.join(folder, "run")) for a in args)]
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{tree}: {' '.join(args)} failed:\n{done.stderr[-1500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="the tree before (a checkout's root)")
    parser.add_argument("second", help="the tree after")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the times to this file")
    args = parser.parse_args()
    times: dict[str, dict[str, list[float]]] = {name: {"first": [], "second": []} for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            for which in ("first", "second"):
                times[name][which].append(timed(getattr(args, which), command))
    print("| path | before (s) | after (s) | after / before |")
    print("|---|--:|--:|--:|")
    for name, runs in times.items():
        before, after = statistics.median(runs["first"]), statistics.median(runs["second"])
        print(f"| {name} | {before:.2f} | {after:.2f} | {after / before:.2f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"trees": [args.first, args.second], "repeats": args.repeats, "seconds": times}, out, indent=1)


if __name__ == "__main__":
    main()
