"""The Trainer mode of gaplan next to transformers' ``auto_find_batch_size``, on one Trainer, in one run.

A GPT-2 (4 layers x 256, vocab 8192, seq 128), AdamW, a CPU budget (default 512 MiB), full-length samples, and an
effective batch of 64. Each tool runs in a fresh process under ``gaplan.cpu_budget``:

* ``auto_find_batch_size``: the Trainer starts at ``--start`` samples per device and, on each OOM, multiplies by
  0.9 and trains again in the same process (no accumulation: the effective batch shrinks with it);
* gaplan's Trainer mode: ``plan_training_arguments(model_init, args, 64, probe="trainer", train_dataset=...)``,
  trials of ``trainer.train()`` (2 optimizer steps of 2 micro-batches), each a fork, and the plan.

Then each one's batch size trains two optimizer steps of two micro-batches in a new process (the steady state: the
optimizer's states allocated, gradients held across micro-steps). Prints a Markdown table:

    python examples/trainer_probe_vs_auto_find.py [--limit 512MiB] [--start 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

# isort: off
import gaplan  # first: MKL's pooled workspace off before torch loads, as in the probe's trials
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

# isort: on

SEQ_LEN, EFFECTIVE_BATCH = 128, 64


def model_init() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=SEQ_LEN,
                                      use_cache=False))


def dataset(count: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, 8192, (SEQ_LEN,), generator=generator)
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


def collate(rows: list[dict]) -> dict:
    return {key: torch.stack([row[key] for row in rows]) for key in ("input_ids", "labels")}


def arguments(output_dir: str, **kwargs) -> TrainingArguments:
    settings = dict(output_dir=output_dir, use_cpu=True, learning_rate=1e-4, report_to=[], save_strategy="no",
                    logging_strategy="no", disable_tqdm=True, remove_unused_columns=False, dataloader_pin_memory=False)
    return TrainingArguments(**{**settings, **kwargs})


def auto_find(limit: str, start: int) -> dict:
    """transformers' own search, as a user runs it: starting at ``start``, 2 optimizer steps once it trains."""
    with tempfile.TemporaryDirectory() as output_dir:
        args = arguments(output_dir, per_device_train_batch_size=start, gradient_accumulation_steps=1, max_steps=2,
                         auto_find_batch_size=True)
        rows = dataset(4 * start)
        gaplan.cpu_budget(limit)
        started = time.perf_counter()
        trainer = Trainer(model=model_init(), args=args, train_dataset=rows, data_collator=collate)
        trainer.train()
        return {"batch": int(trainer._train_batch_size), "seconds": time.perf_counter() - started}


def trainer_mode(limit: str) -> dict:
    """gaplan's Trainer mode: the plan for the effective batch, from trials of trainer.train()."""
    import warnings

    from gaplan.integrations.transformers import UnevenPlanWarning, plan_training_arguments, resolve_plan

    with tempfile.TemporaryDirectory() as output_dir:
        args = arguments(output_dir)
        started = time.perf_counter()
        plan = resolve_plan(model_init, args, EFFECTIVE_BATCH, probe="trainer", train_dataset=dataset(32),
                            data_collator=collate, memory_limit=limit)
        seconds = time.perf_counter() - started
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnevenPlanWarning)  # the Trainer needs equal micro-batches: said below
            planned = plan_training_arguments(None, args, EFFECTIVE_BATCH, plan=plan)
        return {"edge": plan.micro_batch_cap, "batch": planned.per_device_train_batch_size,
                "accumulation": planned.gradient_accumulation_steps, "seconds": seconds}


def steady_state(limit: str, micro_batch: int) -> bool:
    """Two optimizer steps of two micro-batches of ``micro_batch`` samples under the budget, in this process."""
    with tempfile.TemporaryDirectory() as output_dir:
        args = arguments(output_dir, per_device_train_batch_size=micro_batch, gradient_accumulation_steps=2,
                         max_steps=2)
        rows = dataset(4 * micro_batch)
        gaplan.cpu_budget(limit)
        try:
            Trainer(model=model_init(), args=args, train_dataset=rows, data_collator=collate).train()
        except RuntimeError as exc:
            if "can't allocate memory" not in str(exc):
                raise
            return False
        return True


def _in_fresh_process(*argv: str) -> dict:
    completed = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="512MiB")
    parser.add_argument("--start", type=int, default=64)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        kind, *rest = options.child
        result = (auto_find(options.limit, options.start) if kind == "auto-find" else
                  trainer_mode(options.limit) if kind == "trainer-mode" else
                  {"trains": steady_state(options.limit, int(rest[0]))})
        print(json.dumps(result))
        return
    rows = []
    for name, kind in (("transformers auto_find_batch_size", "auto-find"), ("gaplan Trainer mode", "trainer-mode")):
        found = _in_fresh_process("--limit", options.limit, "--start", str(options.start), "--child", kind)
        edge = found.get("edge", found["batch"])
        trains = _in_fresh_process("--limit", options.limit, "--child", "steady", str(edge))["trains"]
        accumulation = found.get("accumulation", 1)
        rows.append((name, edge, f"{found['batch']} x {accumulation}", found["batch"] * accumulation,
                     found["seconds"], trains))
    print(f"budget {options.limit}, effective batch asked {EFFECTIVE_BATCH}, auto_find starting at {options.start}\n")
    print("| tool | largest batch found | Trainer runs (batch x accumulation) | effective batch | wall time "
          "| the largest trains 2 steps of 2 micro-batches |")
    print("|---|--:|--:|--:|--:|---|")
    for name, edge, split, effective, seconds, trains in rows:
        print(f"| {name} | {edge} | {split} | {effective} | {seconds:.1f} s | "
              f"{'yes' if trains else 'no: out of memory'} |")
    print("\n(the Trainer feeds equal micro-batches: gaplan runs the largest divisor of the effective batch that fits)")


if __name__ == "__main__":
    main()
