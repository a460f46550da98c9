"""The token-budget probe docs/token-budgets.md shows: its corpus script, run as written, then `gaplan probe --batch-by
tokens` on it; the run folder's tokens.json, with when and where it ran, becomes the committed measurement.

    python examples/token_probe.py --json docs/data/token_probe.json     # about 1.5 minutes on 2 cores

The page's sample output is compared with that file by tests/test_docs_claims.py: after re-measuring, paste the
printed output into the page (a test fails until the two agree).
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "token-budgets.md")
PROBE = ["--tokenizer", "bytes", "--seq-len", "256", "--memory-limit", "512MiB", "--threads", "1", "--batch-by",
         "tokens"]


def corpus_script() -> str:
    """The page's own script (between ``python - > corpus.txt <<'EOF'`` and ``EOF``): the data is what readers get."""
    with open(PAGE) as file:
        return file.read().split("python - > corpus.txt <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, metavar="PATH", help="write the measurement here")
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "corpus.txt"), "w") as corpus:
            subprocess.run([sys.executable, "-c", corpus_script()], stdout=corpus, check=True)
        started = time.perf_counter()
        out = os.path.join(folder, "out")
        done = subprocess.run([sys.executable, "-m", "gaplan", "probe", "--data", "corpus.txt", *PROBE, "--out", out],
                              cwd=folder, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT,
                                                                                   GAPLAN_CACHE_DIR=folder))
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        with open(os.path.join(out, "tokens.json")) as file:
            tokens = json.load(file)
        printed = done.stdout.replace(out, "reports/probe-tiny-gpt2-<time>")
    tokens["command"] = tokens["command"].replace(f" --out {out}", "")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    data = {"made_by": "python examples/token_probe.py --json " + os.path.relpath(os.path.abspath(args.json), ROOT),
            "measured": {"date": datetime.date.today().isoformat(), "cpu": cpu, "cores": os.cpu_count(),
                         "torch": torch.__version__, "wall_seconds": round(wall)},
            **tokens}
    with open(args.json, "w") as file:
        json.dump(data, file, indent=1)
        file.write("\n")
    print(printed, end="")


if __name__ == "__main__":
    main()
