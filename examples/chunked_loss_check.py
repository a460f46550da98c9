"""Issue 47's held-out check of --loss chunked: a Llama-shaped model with a 32k vocabulary at seq 256 on the CPU.

    python examples/chunked_loss_check.py --json docs/data/chunked_loss.json     # ~10 min on 2 cores

The model is built from a ``LlamaConfig`` (4 layers x 256, GQA 4/2, vocabulary 32,000), a shape no test or default
was tuned on. Two measurements, each through the ``gaplan`` command line in a fresh process, as a user runs it:

* B*: ``gaplan probe`` under a fixed budget with ``--loss plain`` and ``--loss chunked`` (the default chunk);
* the weights: ``gaplan train`` for 2 optimizer steps of uneven micro-batches (3 + 2 for an effective batch of 5),
  plain and chunked, from the same seed and data; the largest difference of any weight, over that tensor's largest
  magnitude. SGD shows the loss's own agreement; AdamW is recorded too (its step turns an element whose gradient is
  at fp32's rounding floor into a whole step, docs/levers.md).

``tests/test_docs_numbers.py`` renders docs/levers.md's table from the file.
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
SEQ_LEN, BUDGET, EFFECTIVE = 256, "1GiB", 64
LOSSES = ("plain", "chunked")


def llama_32k(folder: str) -> dict:
    """A Llama config with a 32k vocabulary, saved in ``folder``; returns its shape."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=32000,
                                      max_position_embeddings=512, tie_word_embeddings=False)
    config.save_pretrained(folder)
    return {"hidden": 256, "layers": 4, "heads": "4/2", "vocab": 32000, "seq_len": SEQ_LEN}


def gaplan(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "gaplan", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"gaplan {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done


def probe_edge(model: str, loss: str) -> dict:
    options = ["--model", model, "--seq-len", str(SEQ_LEN), "--memory-limit", BUDGET, "--effective-batch",
               str(EFFECTIVE), "--loss", loss, "--threads", "1"]
    with tempfile.TemporaryDirectory() as out:
        gaplan("probe", *options, "--quiet", "--out", out)
        with open(os.path.join(out, "plan.json")) as file:
            result = json.load(file)
    trials = [[t["micro_batch"], t["fits"]] for t in result.get("trials", [])]
    return {"command": "gaplan probe --model LLAMA_32K " + " ".join(options[2:]), "edge": result["max_micro_batch"],
            "trials": trials}


def trained_weights(model: str, loss: str, optimizer: str, folder: str) -> str:
    path = os.path.join(folder, f"{loss}-{optimizer}.safetensors")
    gaplan("train", "--model", model, "--seq-len", str(SEQ_LEN), "--loss", loss, "--optimizer", optimizer,
           "--effective-batch", "5", "--micro-batch", "3", "--steps", "2", "--seed", "0", "--threads", "1",
           "--quiet", "--out", os.path.join(folder, f"run-{loss}-{optimizer}"), "--save-weights", path)
    return path


def largest_difference(first: str, second: str) -> float:
    """The largest |a - b| of any weight over its tensor's largest |a|."""
    from safetensors.torch import load_file

    a, b = load_file(first), load_file(second)
    assert a.keys() == b.keys()
    worst = 0.0
    for name, tensor in a.items():
        scale = float(tensor.abs().max()) or 1.0
        worst = max(worst, float((tensor - b[name]).abs().max()) / scale)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where to write the measurements")
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory(prefix="gaplan-llama32k-") as folder:
        model = os.path.join(folder, "llama-32k")
        shape = llama_32k(model)
        probes = {loss: probe_edge(model, loss) for loss in LOSSES}
        print({loss: p["edge"] for loss, p in probes.items()}, flush=True)
        weights = {}
        for optimizer in ("sgd", "adamw"):
            paths = {loss: trained_weights(model, loss, optimizer, folder) for loss in LOSSES}
            weights[optimizer] = largest_difference(paths["plain"], paths["chunked"])
        print(weights, flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    record = {"date": datetime.date.today().isoformat(), "made_by": "python examples/chunked_loss_check.py --json "
              + args.json, "machine": {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__},
              "model": shape, "budget": BUDGET, "effective_batch": EFFECTIVE, "probes": probes,
              "weights": {"micro_batches": [3, 2], "steps": 2, "largest_difference": weights}}
    with open(args.json, "w") as out:
        json.dump(record, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
