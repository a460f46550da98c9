"""What a probe costs: gaplan's probe seeded by a trusted estimate, its plain search, and Lightning's binsearch finder.

    python examples/probe_cost.py                 # GPT-2 4 x 256, vocab 8192, seq 256, a 1 GiB CPU budget, 3 repeats
    python examples/probe_cost.py --repeats 1     # one round (a few minutes on 2 cores)

The workload is one no preset was tuned on: a GPT-2 of 4 layers x 256 with a vocabulary of 8192, built from its
config in a temporary folder, at seq 256 under a 1 GiB CPU budget. Each finder runs in a fresh Python process
(this script again, with ``--child``), timed from the call to its answer (imports and interpreter start excluded):

* ``gaplan`` - ``gaplan probe`` as it runs by default: GPT-2 is in the estimate's zoo, so the search starts at the
  estimate's edge (traced on fake tensors) and confirms it with trials beside it;
* ``gaplan --no-seed-from-estimate`` - the plain search (doubling, then bisection);
* ``Lightning binsearch`` - ``Tuner.scale_batch_size(mode="binsearch")`` from its default start, 2
  (``examples/compare_with_peers.py`` runs it the same way: two accumulated micro-batches, then AdamW).

Rounds are interleaved; the script prints each finder's median seconds, its answer and trials, and the ratio of
gaplan's median to binsearch's (docs/estimate.md reports it).
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

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ_LEN, LIMIT = 256, "1GiB"
FINDERS = ("gaplan", "gaplan-plain", "lightning-binsearch")
NAMES = {"gaplan": "gaplan probe (seeded by the estimate)", "gaplan-plain": "gaplan probe --no-seed-from-estimate",
         "lightning-binsearch": "Lightning scale_batch_size (binsearch)"}


def make_model(folder: str) -> None:
    import transformers

    transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=8192, n_positions=SEQ_LEN, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0).save_pretrained(folder)


def child(task: dict) -> dict:
    from gaplan import WorkloadSpec
    from gaplan.core.units import parse_bytes

    spec = WorkloadSpec(model=task["model"], seq_len=SEQ_LEN)
    limit = parse_bytes(LIMIT)
    if task["tool"] == "lightning-binsearch":
        sys.path.insert(0, HERE)
        from compare_with_peers import run_finder

        started = time.perf_counter()
        found = run_finder({"tool": "lightning-binsearch", "workload": spec.to_dict(), "limit_bytes": limit,
                            "threads": task["threads"]})
        return {**found, "seconds": time.perf_counter() - started}
    from gaplan.workflows.probe import run_probe

    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        run = run_probe(spec, out, device="cpu", memory_limit=limit, threads=task["threads"] or None, effective_batch=64,
                        seed_from_estimate=None if task["tool"] == "gaplan" else False)
        seconds = time.perf_counter() - started
    return {"found": run.result.max_micro_batch, "trials": [[t.micro_batch, t.fits] for t in run.result.trials],
            "seed": run.estimate_seed, "seconds": seconds}


def run_child(task: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(task)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{task['tool']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (default: torch's own)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    results: dict[str, list[dict]] = {tool: [] for tool in FINDERS}
    with tempfile.TemporaryDirectory(prefix="gaplan-probe-cost-") as folder:
        make_model(folder)
        for round_ in range(args.repeats):
            for tool in FINDERS:
                result = run_child({"tool": tool, "model": folder, "threads": args.threads})
                results[tool].append(result)
                tried = " ".join(f"{b}{'' if fits else 'x'}" for b, fits in result["trials"])
                print(f"round {round_ + 1}: {NAMES[tool]}: {result['found']} in {result['seconds']:.1f} s "
                      f"[{tried}]", file=sys.stderr, flush=True)
    medians = {tool: statistics.median(r["seconds"] for r in runs) for tool, runs in results.items()}
    print(f"GPT-2 4 x 256, vocab 8192, seq {SEQ_LEN}, {LIMIT} CPU budget, {args.repeats} round(s), median seconds:")
    for tool in FINDERS:
        last = results[tool][-1]
        print(f"  {NAMES[tool]:<42} {medians[tool]:6.1f} s  found {last['found']:>3}  trials {len(last['trials'])}")
    print(f"gaplan / binsearch: {medians['gaplan'] / medians['lightning-binsearch']:.2f}x   "
          f"plain gaplan / binsearch: {medians['gaplan-plain'] / medians['lightning-binsearch']:.2f}x")


if __name__ == "__main__":
    main()
