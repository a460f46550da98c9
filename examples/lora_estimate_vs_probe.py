"""LoRA's estimate next to its probe on CPU, and LoRA's edge next to full fine-tuning's, on one budget.

    python examples/lora_estimate_vs_probe.py                      # tiny-gpt2, seq 128, 512 MiB, 1 thread (~1 min)
    python examples/lora_estimate_vs_probe.py --model tiny-llama --seq-len 256 --budget 1GiB
    python examples/lora_estimate_vs_probe.py --model tiny-llama --qlora   # QLoRA (bitsandbytes nf4) as a third row

Probes (real trials in fresh processes, under the budget) and estimates (fake tensors, nothing allocated) LoRA
r 16 on peft's default targets and full fine-tuning. Prints the estimate's peak against the probe's measured peak at
three micro-batches (the probe's own trials: the smallest, one in the middle, its B*), and each one's B*. Prints
numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def gaplan(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "gaplan", *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gaplan {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gpt2")
    parser.add_argument("--seq-len", default="128")
    parser.add_argument("--budget", default="512MiB")
    parser.add_argument("--qlora", action="store_true", help="also QLoRA: the base in 4-bit nf4 (needs bitsandbytes)")
    args = parser.parse_args()
    common = ["--model", args.model, "--seq-len", args.seq_len, "--memory-limit", args.budget, "--threads", "1",
              "--effective-batch", "64", "--quiet"]
    results = {}
    runs = [("LoRA", ["--lora"]), ("full", [])] + ([("QLoRA", ["--lora", "--quantize", "4bit"])] if args.qlora else [])
    for name, extra in runs:
        # The full search (not seeded from the estimate, which would measure B* and B*+1 alone) measures a ladder
        # of sizes to set the estimate beside.
        probe = gaplan("probe", *common, *extra, "--device", "cpu", "--no-seed-from-estimate")
        fits = sorted((t["micro_batch"], t["peak_bytes"]) for t in probe["trials"] if t["fits"])
        picked = [fits[0], fits[len(fits) // 2], fits[-1]]
        # The line is drawn through the first two; the estimate traces its own B* (and B*+1) as well.
        sizes = ",".join(str(b) for b, _ in picked[:2])
        estimate = gaplan("estimate", *common, *extra, "--device", "cpu", "--sizes", sizes)
        predicted = {r["micro_batch"]: r["peak_bytes"] for r in estimate["rows"] if r["phase"] != "optimizer-step"}
        line = estimate["line"]
        for micro_batch, _ in picked:  # a size the estimate did not trace: its memory line's value
            predicted.setdefault(micro_batch, int(line["intercept"] + line["slope"] * micro_batch))
        results[name] = (probe["max_micro_batch"], estimate["max_micro_batch"], picked, predicted)
    print(f"{args.model}, seq {args.seq_len}, budget {args.budget}, AdamW, 1 thread, CPU")
    for name, (probed, estimated, picked, predicted) in results.items():
        print(f"\n{name}: B* probed {probed}, estimated {estimated}")
        print(f"{'micro-batch':>11} {'probe peak':>12} {'estimate':>12} {'difference':>10}")
        for micro_batch, measured in picked:
            guess = predicted.get(micro_batch)
            difference = f"{(guess - measured) / measured:+.1%}" if guess else "-"
            print(f"{micro_batch:>11} {measured / 2**20:>10.1f}Mi {(guess or 0) / 2**20:>10.1f}Mi {difference:>10}")
    qlora = f", QLoRA's {results['QLoRA'][0]}" if "QLoRA" in results else ""
    print(f"\nLoRA's B* {results['LoRA'][0]} vs full fine-tuning's {results['full'][0]}{qlora} (probed) on {args.budget}")


if __name__ == "__main__":
    main()
