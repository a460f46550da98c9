"""`gaplan train` next to a plain loop and the HF Trainer: the same model, split, data and optimizer, step times
measured in interleaved rounds of fresh processes.

    python examples/train_speed.py                 # GPT-2 4 x 256, vocab 8192, seq 128, E = 32 = 8 x 4 (~5 min)
    python examples/train_speed.py --quick         # a smaller model, a minute or two

Every round starts one fresh process per loop (gaplan train, a plain loop, the Trainer), in an order that
alternates from round to round, so a noisy minute hits each loop alike. Each process trains ``--warmup`` untimed
and ``--steps`` timed optimizer steps; its step time is the median of the timed ones. The ratio of two loops is
taken round by round and printed with its 95% interval (gaplan.benchmark.stats). The plain loop and the Trainer
run without gaplan's allocator settings, as a user's loop has them; so does `gaplan train` without
``--enforce-memory-limit``. Prints numbers; asserts nothing about speed.
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

LOOPS = ("gaplan train", "plain loop", "HF Trainer")
SIZES = {"full": {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 8192, "seq_len": 128},
         "quick": {"n_layer": 2, "n_embd": 128, "n_head": 2, "vocab_size": 4096, "seq_len": 64}}


def write_model(folder: str, size: dict) -> None:
    """A GPT-2 config folder (no weights: every loop starts from the same seeded random init)."""
    from transformers import GPT2Config

    GPT2Config(n_layer=size["n_layer"], n_embd=size["n_embd"], n_head=size["n_head"], vocab_size=size["vocab_size"],
               n_positions=size["seq_len"], bos_token_id=0, eos_token_id=0).save_pretrained(folder)


def gaplan_step_seconds(task: dict) -> list[float]:
    """`gaplan train` as a user runs it; its per-step times from train_log.csv."""
    import csv

    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "gaplan", "train", "--model", task["model"], "--init", "random",
                   "--seq-len", str(task["seq_len"]), "--effective-batch", str(task["effective_batch"]),
                   "--micro-batch", str(task["micro_batch"]), "--steps", str(task["warmup"] + task["steps"]),
                   "--threads", str(task["threads"]), "--out", out, "--quiet", "--json"]
        subprocess.run(command, check=True, capture_output=True, text=True)
        with open(os.path.join(out, "train_log.csv")) as log:
            return [float(row["seconds"]) for row in csv.DictReader(log)]


def child(task: dict) -> list[float]:
    """The plain loop or the Trainer on the samples gaplan's loop takes, step by step; each step's seconds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gaplan.data import SyntheticCorpus, collate, step_indices

    torch.set_num_threads(task["threads"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(task["model"]))
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    effective, micro = task["effective_batch"], task["micro_batch"]
    steps = task["warmup"] + task["steps"]
    corpus = SyntheticCorpus(task["seq_len"], seed=0)
    samples = [corpus[i] for step in range(steps) for i in step_indices(step, effective, len(corpus))]
    ends = [time.perf_counter()]
    if task["loop"] == "plain loop":  # as people write it: each micro-batch's mean loss over the accumulation steps
        model.train()
        for step in range(steps):
            for first in range(step * effective, (step + 1) * effective, micro):
                batch = collate(samples[first:first + micro], "causal-lm")
                (model(**batch).loss / (effective // micro)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ends.append(time.perf_counter())
    else:
        from transformers import Trainer, TrainerCallback, TrainingArguments

        class StepTimes(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                ends.append(time.perf_counter())

        with tempfile.TemporaryDirectory() as output_dir:
            arguments = TrainingArguments(
                output_dir=output_dir, per_device_train_batch_size=micro, gradient_accumulation_steps=effective // micro,
                max_steps=steps, lr_scheduler_type="constant", learning_rate=1e-3, use_cpu=True, report_to=[],
                save_strategy="no", disable_tqdm=True, logging_steps=10**6, remove_unused_columns=False,
                dataloader_pin_memory=False, seed=0, train_sampling_strategy="sequential")
            trainer = Trainer(model=model, args=arguments, train_dataset=samples,
                              data_collator=lambda batch: collate(batch, "causal-lm"), optimizers=(optimizer, None),
                              callbacks=[StepTimes()])
            ends[0] = time.perf_counter()
            trainer.train()
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def run_loop(task: dict) -> float:
    """One fresh process of one loop: the median of its timed steps."""
    if task["loop"] == "gaplan train":
        seconds = gaplan_step_seconds(task)
    else:
        # The user's own loop, in its own process, without gaplan's allocator settings (gaplan.data is imported
        # only for the same batches; this keeps its import from switching MKL's pool off).
        env = dict(os.environ, GAPLAN_NATIVE_ALLOCATOR="1")
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(task)], check=True, capture_output=True,
                              text=True, env=env)
        seconds = json.loads(done.stdout.strip().splitlines()[-1])
    timed = seconds[task["warmup"]:]
    if len(timed) < task["steps"]:
        raise RuntimeError(f"{task['loop']} ran {len(seconds)} steps, expected {task['warmup'] + task['steps']}")
    return statistics.median(timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--effective-batch", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    from gaplan.benchmark.stats import estimate, paired_ratio

    size = SIZES["quick" if args.quick else "full"]
    with tempfile.TemporaryDirectory() as model:
        write_model(model, size)
        base = {"model": model, "seq_len": size["seq_len"], "effective_batch": args.effective_batch,
                "micro_batch": args.micro_batch, "warmup": args.warmup, "steps": args.steps, "threads": args.threads}
        steps: dict[str, list[float]] = {loop: [] for loop in LOOPS}
        for round_number in range(1, args.rounds + 1):
            order = LOOPS if round_number % 2 else tuple(reversed(LOOPS))
            for loop in order:
                steps[loop].append(run_loop(dict(base, loop=loop)))
                print(f"round {round_number}  {loop:<12}  {steps[loop][-1]:.3f} s a step", file=sys.stderr)
    print(f"GPT-2 {size['n_layer']} x {size['n_embd']}, vocab {size['vocab_size']}, seq {size['seq_len']}, AdamW, "
          f"E = {args.effective_batch} = {args.micro_batch} x {args.effective_batch // args.micro_batch}, "
          f"{args.threads} threads; {args.rounds} interleaved rounds of fresh processes, median of {args.steps} "
          f"steps after {args.warmup} warm-up steps each")
    print("| loop | step s (median over rounds) | rounds | speed vs the plain loop (95% CI) |")
    print("|---|--:|--:|--:|")
    for loop in LOOPS:
        # Speed is 1 / step time: the plain loop's step over this loop's, round by round.
        versus = paired_ratio([1 / s for s in steps[loop]], [1 / s for s in steps["plain loop"]])
        interval = "" if versus.low is None else f" ({versus.low:.2f}-{versus.high:.2f})"
        print(f"| {loop} | {statistics.median(steps[loop]):.3f} | {len(steps[loop])} | {versus.value:.2f}x{interval} |")
    print(f"gaplan train's step, all rounds: {', '.join(f'{s:.3f}' for s in steps['gaplan train'])} s "
          f"(geometric mean {estimate(steps['gaplan train']).value:.3f} s)")


if __name__ == "__main__":
    main()
