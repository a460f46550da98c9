"""gaplan next to the tools people use today: batch-size finding, training-loop speed, loss correctness.

    pip install -e ".[compare]"                                  # adds pytorch-lightning (accelerate is a dependency)
    python examples/compare_with_peers.py                        # the README's numbers, into reports/peers/
                                                                 # (about 10 minutes on 2 cores)
    python examples/compare_with_peers.py --quick --out /tmp/peers   # a small workload, a few minutes

Every measurement runs in a fresh Python process (this script again, with ``--child``),
on the same workload, the same CPU memory budget and the same number of threads:

1. **Batch-size finding** under the budget: ``gaplan.probe`` vs accelerate's
   ``find_executable_batch_size`` (its default start, 128) vs Lightning's
   ``Tuner.scale_batch_size`` in ``power`` and ``binsearch`` mode (its defaults). Every
   tool's trial runs the same step: two accumulated micro-batches of the model's token
   loss, then AdamW, for two optimizer steps (Lightning: its default three). The true
   edge is then checked in fresh processes (B trains two optimizer steps, B+1 runs out
   of memory), and so is each tool's answer.
2. **Training loop** samples/s at one micro-batch and accumulation: ``gaplan.train``
   (the loop behind ``gaplan train``) vs the stock ``transformers.Trainer`` vs a minimal
   hand-written loop; the same model, data (padded, varied lengths, the same samples per
   step), AdamW and gradient clipping at 1.0; repeats interleaved, median and ratio.
3. **Loss correctness**: on padded sequences of varied length, each tool's accumulated
   gradient vs the gradient of the true large batch (the mean over all its target tokens).

The CPU budget is gaplan's (RLIMIT_DATA over the memory held once the libraries are
imported), imposed the same way in every process, so "runs out of memory" means the
same for every tool.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
MICRO_STEPS = 2  # micro-batches per optimizer step in every batch-size trial (accumulation is the point)
TRIAL_OPTIMIZER_STEPS = 2  # what gaplan's trial runs; the accelerate-wrapped function runs the same
ACCELERATE_START = 128  # find_executable_batch_size's default starting_batch_size
LIGHTNING_STEPS_PER_TRIAL = 3  # scale_batch_size's default, passed explicitly so the count below matches it
FINDERS = ("gaplan", "accelerate", "lightning-power", "lightning-binsearch")
LOOPS = ("gaplan", "hf-trainer", "hand")
LOSS_TOOLS = ("gaplan", "hf-trainer+gaplan", "hf-trainer", "accelerate-accumulate", "lightning", "hand")
TOOL_NAMES = {
    "gaplan": "gaplan",
    "accelerate": "accelerate find_executable_batch_size",
    "lightning-power": "Lightning scale_batch_size (power)",
    "lightning-binsearch": "Lightning scale_batch_size (binsearch)",
    "hf-trainer": "HF Trainer",
    "hf-trainer+gaplan": "HF Trainer + gaplan (GaplanTrainer)",
    "hand": "hand-written loop",
    "lightning": "Lightning accumulate_grad_batches",
    "accelerate-accumulate": "accelerate Accelerator.accumulate",
}


@dataclass(frozen=True)
class Settings:
    """One comparison's workload and sizes."""

    model: str
    seq_len: int
    memory_limit: str
    loop_micro_batch: int
    loop_accumulation: int
    loop_warmup: int
    loop_steps: int
    repeats: int
    threads: int


FULL = Settings("tiny-gpt2", 128, "1GiB", 8, 4, 1, 4, 3, 0)
QUICK = Settings("tiny-gpt2", 32, "256MiB", 4, 2, 1, 2, 1, 0)


# ---------------------------------------------------------------------------------------------------------------------
# In a child process: one tool, one measurement, one JSON line out


def child(task: dict) -> dict:
    if task["threads"]:  # torch is imported only when asked: gaplan's probe needs none in the caller's process
        import torch

        torch.set_num_threads(task["threads"])
    part = task["part"]
    if part == "finder":
        return run_finder(task)
    if part == "loop":
        return run_loop(task)
    return run_loss(task)


def run_steps(workload, micro_batch: int, optimizer_steps: int) -> None:
    """The trial every finder runs: accumulated steps of ``MICRO_STEPS`` micro-batches, then the optimizer."""
    from gaplan import accumulate_gradients

    for _ in range(optimizer_steps):
        batches = [workload.make_batch(micro_batch) for _ in range(MICRO_STEPS)]
        accumulate_gradients(workload.model, batches, workload.raw_loss, workload.task)
        workload.optimizer.step()
        workload.optimizer.zero_grad(set_to_none=True)
        del batches


def run_finder(task: dict) -> dict:
    from gaplan import WorkloadSpec, probe

    spec = WorkloadSpec(**task["workload"])
    if task["tool"] == "gaplan":
        result = probe(spec, device="cpu", memory_limit=task["limit_bytes"], threads=task["threads"] or None)
        return {"found": result.max_micro_batch, "trials": [[t.micro_batch, t.fits] for t in result.trials]}
    from gaplan.devices.cpu import CpuBackend
    from gaplan.workload.build import build_workload

    if task["tool"] == "accelerate":
        from accelerate.utils import find_executable_batch_size
    else:
        import pytorch_lightning  # noqa: F401 - imported before the budget, as gaplan imports torch before it
    # As in gaplan's worker: the model's code is imported (a build on meta) before the budget is set,
    # and the budget is set before the model is built, so weights and states count against it.
    build_workload(spec, "meta")
    CpuBackend().activate(task["limit_bytes"])
    workload = build_workload(spec, "cpu")
    trials: list[list] = []
    if task["tool"] == "accelerate":
        @find_executable_batch_size(starting_batch_size=ACCELERATE_START)
        def train(batch_size: int) -> int:
            trials.append([batch_size, False])
            workload.optimizer.zero_grad(set_to_none=True)
            run_steps(workload, batch_size, TRIAL_OPTIMIZER_STEPS)
            trials[-1][1] = True
            return batch_size

        return {"found": train(), "trials": trials}
    return {"found": lightning_scale(workload, task["tool"].split("-")[1], trials), "trials": trials}


def lightning_scale(workload, mode: str, trials: list[list]) -> int:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.tuner import Tuner

    from gaplan.workload.loss import count_targets

    class FullLengthSamples(torch.utils.data.Dataset):
        """Samples of the workload's worst case (full length), the same as gaplan's trials use."""

        def __len__(self) -> int:
            return 1 << 20

        def __getitem__(self, index: int) -> dict:
            return {k: v[0] for k, v in workload.make_batch(1).items()}

    class Finder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = workload.model
            self.batch_size = 2

        def train_dataloader(self):
            return torch.utils.data.DataLoader(FullLengthSamples(), batch_size=self.batch_size)

        def training_step(self, batch, batch_idx):
            return workload.raw_loss(self.model, batch) / max(count_targets(batch, workload.task), 1)

        def configure_optimizers(self):
            return workload.optimizer

        def on_train_batch_start(self, batch, batch_idx):
            if batch_idx == 0:  # every trial restarts the loop
                trials.append([self.batch_size, 0])

        def on_train_batch_end(self, outputs, batch, batch_idx):
            trials[-1][1] += 1

    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(accelerator="cpu", devices=1, accumulate_grad_batches=MICRO_STEPS, max_steps=1,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=root)
        found = Tuner(trainer).scale_batch_size(Finder(), mode=mode, steps_per_trial=LIGHTNING_STEPS_PER_TRIAL)
    for trial in trials:
        trial[1] = trial[1] >= LIGHTNING_STEPS_PER_TRIAL * MICRO_STEPS
    return int(found)


def corpus_and_plan(task: dict):
    from gaplan import WorkloadSpec, make_plan
    from gaplan.data import SyntheticCorpus
    from gaplan.workload.build import build_workload

    workload = build_workload(WorkloadSpec(**task["workload"]), "cpu", seed=0)
    corpus = SyntheticCorpus(workload.seq_len, seed=0)
    plan = make_plan(task["micro_batch"] * task["accumulation"], task["micro_batch"])
    return workload, corpus, plan


def run_loop(task: dict) -> dict:
    """Time ``warmup + steps`` optimizer steps of one loop; samples/s over the steps after the warm-up."""
    import torch

    from gaplan.data import collate, step_indices

    workload, corpus, plan = corpus_and_plan(task)
    total = task["warmup"] + task["steps"]
    # The samples gaplan.train takes, step by step, in order: the other two loops read them sequentially.
    samples = [corpus[i] for step in range(total) for i in step_indices(step, plan.effective_batch, len(corpus))]
    step_ends: list[float] = [time.perf_counter()]
    if task["tool"] == "gaplan":
        from gaplan.training.loop import TrainConfig, train

        train(workload, plan, corpus, TrainConfig(steps=total, max_grad_norm=1.0),
              on_step=lambda log: step_ends.append(time.perf_counter()))
    elif task["tool"] == "hf-trainer":
        from transformers import Trainer, TrainerCallback

        class StepTimes(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                step_ends.append(time.perf_counter())

        with tempfile.TemporaryDirectory() as output_dir:
            trainer = Trainer(model=workload.model, args=trainer_arguments(output_dir, plan, total, max_grad_norm=1.0),
                              train_dataset=samples, data_collator=lambda batch: collate(batch, workload.task),
                              optimizers=(workload.optimizer, None), callbacks=[StepTimes()])
            trainer.train()
    else:  # the loop people write by hand: the model's mean loss divided by the accumulation steps
        model, optimizer = workload.model, workload.optimizer
        for step in range(total):
            for first in range(step * plan.effective_batch, (step + 1) * plan.effective_batch, plan.micro_batch):
                batch = collate(samples[first:first + plan.micro_batch], workload.task)
                (model(**batch).loss / plan.grad_accum_steps).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_ends.append(time.perf_counter())
    timed = step_ends[-1] - step_ends[task["warmup"]]
    return {"samples_per_s": task["steps"] * plan.effective_batch / timed, "steps": len(step_ends) - 1}


def trainer_arguments(output_dir: str, plan, steps: int, max_grad_norm: float):
    """The Trainer's arguments for ``plan``: sequential sampling, so its micro-batches are everyone's."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=plan.micro_batch,
        gradient_accumulation_steps=plan.grad_accum_steps, max_steps=steps, lr_scheduler_type="constant",
        max_grad_norm=max_grad_norm, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
        logging_steps=10**6, remove_unused_columns=False, dataloader_pin_memory=False, seed=0,
        train_sampling_strategy="sequential")


LOSS_EFFECTIVE_BATCH, LOSS_MICRO_BATCH, LOSS_SEQ_LEN = 24, 6, 16


def run_loss(task: dict) -> dict:
    """The max relative difference between one tool's accumulated gradient and the large-batch gradient."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    from gaplan import make_plan
    from gaplan.data import SyntheticCorpus, collate

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = AutoModelForCausalLM.from_config(config)
    corpus = SyntheticCorpus(LOSS_SEQ_LEN, seed=0)
    samples = [corpus[i] for i in range(LOSS_EFFECTIVE_BATCH)]
    plan = make_plan(LOSS_EFFECTIVE_BATCH, LOSS_MICRO_BATCH)
    names = {id(p): name for name, p in model.named_parameters()}

    model(**collate(samples, "causal-lm")).loss.backward()  # the true large batch: one mean over all its targets
    reference = {names[id(p)]: p.grad.clone() for p in model.parameters()}
    model.zero_grad(set_to_none=True)

    recorded: dict = {}

    class RecordingSGD(torch.optim.SGD):
        """Keeps the gradients it is asked to apply (lr 0: the weights stay as they are)."""

        def __init__(self, params) -> None:
            super().__init__(params, lr=0.0)

        def step(self, closure=None):
            loss = None
            if closure is not None:  # Lightning runs the last micro-batch inside the closure
                with torch.enable_grad():
                    loss = closure()
            recorded.update({names[id(p)]: p.grad.clone() for g in self.param_groups for p in g["params"]})
            return loss

    micro_batches = [collate(samples[i:i + plan.micro_batch], "causal-lm")
                     for i in range(0, LOSS_EFFECTIVE_BATCH, plan.micro_batch)]
    tool = task["tool"]
    optimizer = RecordingSGD(model.parameters())
    if tool == "gaplan":
        from gaplan import accumulate_gradients
        from gaplan.workload.loss import summed_token_loss

        accumulate_gradients(model, micro_batches, lambda m, b: summed_token_loss(m(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b, "causal-lm"), "causal-lm")
        optimizer.step()
    elif tool in ("hf-trainer", "hf-trainer+gaplan"):
        from transformers import Trainer

        from gaplan.integrations.transformers import GaplanTrainer

        trainer_class = GaplanTrainer if tool == "hf-trainer+gaplan" else Trainer
        with tempfile.TemporaryDirectory() as output_dir:
            trainer_class(model=model, args=trainer_arguments(output_dir, plan, 1, max_grad_norm=0.0),
                          train_dataset=samples, data_collator=lambda batch: collate(batch, "causal-lm"),
                          optimizers=(optimizer, None)).train()
    elif tool == "accelerate-accumulate":
        from accelerate import Accelerator

        accelerator = Accelerator(gradient_accumulation_steps=plan.grad_accum_steps, cpu=True)
        loader = torch.utils.data.DataLoader(samples, batch_size=plan.micro_batch,
                                             collate_fn=lambda batch: collate(batch, "causal-lm"))
        model, prepared, loader = accelerator.prepare(model, optimizer, loader)
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                prepared.step()
                prepared.zero_grad()
    elif tool == "lightning":
        lightning_accumulate(model, optimizer, samples, plan)
    else:
        for batch in micro_batches:
            (model(**batch).loss / plan.grad_accum_steps).backward()
        optimizer.step()
    largest = max(float(r.abs().max()) for r in reference.values())
    difference = max(float((recorded[n] - r).abs().max()) for n, r in reference.items())
    return {"max_relative_difference": difference / largest}


def lightning_accumulate(model, optimizer, samples, plan) -> None:
    import pytorch_lightning as pl
    import torch

    from gaplan.data import collate

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return optimizer

    loader = torch.utils.data.DataLoader(samples, batch_size=plan.micro_batch,
                                         collate_fn=lambda batch: collate(batch, "causal-lm"))
    with tempfile.TemporaryDirectory() as root:
        pl.Trainer(accelerator="cpu", devices=1, max_steps=1, accumulate_grad_batches=plan.grad_accum_steps,
                   logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=root).fit(Module(), loader)


# ---------------------------------------------------------------------------------------------------------------------
# In the parent: run the children, check the edge, write the report


def run_child(task: dict) -> tuple[dict, float]:
    """Run one measurement in a fresh interpreter; returns its result and the process's wall time."""
    from gaplan.devices.cpu import MMAP_THRESHOLD_ENV

    env = dict(os.environ, **MMAP_THRESHOLD_ENV, TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(task)],
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return {"error": f"exit {done.returncode}: {tail}"[:300]}, seconds
    return json.loads(lines[-1]), seconds


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def compare_finders(settings: Settings, spec: dict, limit: int) -> tuple[list[dict], int]:
    from gaplan import WorkloadSpec
    from gaplan.probing.edge import check_in_fresh_process

    rows = []
    for tool in FINDERS:
        say(f"batch-size finding: {TOOL_NAMES[tool]} ...")
        result, seconds = run_child({"part": "finder", "tool": tool, "workload": spec, "limit_bytes": limit,
                                     "threads": settings.threads})
        rows.append({"tool": TOOL_NAMES[tool], "found": result.get("found"), "trials": len(result.get("trials", [])),
                     "tried": " ".join(f"{b}{'' if fits else 'x'}" for b, fits in result.get("trials", [])),
                     "wall_s": round(seconds, 1), "error": result.get("error", "")})
        say(f"  found {rows[-1]['found']} in {rows[-1]['trials']} trials, {seconds:.1f} s {rows[-1]['error']}")

    fits: dict[int, bool] = {}

    def trains(micro_batch: int) -> bool:
        if micro_batch not in fits:
            fits[micro_batch] = check_in_fresh_process(WorkloadSpec(**spec), "cpu", limit, micro_batch,
                                                       optimizer_steps=TRIAL_OPTIMIZER_STEPS, threads=settings.threads or None)
            say(f"  fresh process: micro-batch {micro_batch} {'trains 2 steps' if fits[micro_batch] else 'runs out of memory'}")
        return fits[micro_batch]

    say("the true edge, in fresh processes ...")
    edge = rows[0]["found"] or 1
    while not trains(edge) and edge > 1:  # walk down from gaplan's answer, or up, until B fits and B+1 does not
        edge -= 1
    while trains(edge + 1):
        edge += 1
    for row in rows:
        found = row["found"]
        row["true_edge"] = edge
        row["survives_step_2"] = trains(found) if found else None
        row["of_edge"] = f"{found / edge:.0%}" if found else ""
    return rows, edge


def compare_loops(settings: Settings, spec: dict) -> list[dict]:
    runs: dict[str, list[float]] = {tool: [] for tool in LOOPS}
    errors: dict[str, str] = {}
    for repeat in range(settings.repeats):  # interleaved, so a noisy minute hits every loop alike
        for tool in LOOPS:
            result, _ = run_child({"part": "loop", "tool": tool, "workload": spec, "threads": settings.threads,
                                   "micro_batch": settings.loop_micro_batch, "accumulation": settings.loop_accumulation,
                                   "warmup": settings.loop_warmup, "steps": settings.loop_steps})
            if "error" in result:
                errors[tool] = result["error"]
                continue
            runs[tool].append(result["samples_per_s"])
            say(f"training loop, repeat {repeat + 1}/{settings.repeats}: {TOOL_NAMES[tool]} "
                f"{result['samples_per_s']:.2f} samples/s")
    medians = {tool: statistics.median(values) for tool, values in runs.items() if values}
    rows = []
    for tool in LOOPS:
        median = medians.get(tool)
        rows.append({
            "loop": TOOL_NAMES[tool], "median_samples_per_s": round(median, 3) if median else None,
            "runs": " ".join(f"{v:.2f}" for v in runs[tool]),
            "gaplan_ratio": round(medians["gaplan"] / median, 3) if median and "gaplan" in medians else None,
            "error": errors.get(tool, "")})
    return rows


def compare_losses(settings: Settings) -> list[dict]:
    rows = []
    for tool in LOSS_TOOLS:
        result, _ = run_child({"part": "loss", "tool": tool, "threads": settings.threads})
        difference = result.get("max_relative_difference")
        rows.append({"tool": TOOL_NAMES[tool], "max_relative_difference": difference, "error": result.get("error", "")})
        say(f"loss correctness: {TOOL_NAMES[tool]} {difference if difference is not None else result['error']}")
    return rows


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("gaplan", "torch", "transformers", "accelerate", "pytorch-lightning"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def figure(finders: list[dict], edge: int, loops: list[dict], losses: list[dict]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 5), constrained_layout=True,
                                             gridspec_kw={"width_ratios": [1.2, 0.8, 1.0]})
    labels = [row["tool"].replace(" find_executable_batch_size", "\nfind_executable_batch_size")
              .replace(" scale_batch_size ", "\nscale_batch_size ") for row in finders]
    found = [row["found"] or 0 for row in finders]
    left.barh(labels, found, color=["#2a7" if f == edge else "#c84" for f in found])
    left.axvline(edge, color="#222", linestyle="--", label=f"true edge {edge}")
    for y, row in enumerate(finders):
        left.text((row["found"] or 0) + 0.3, y, f"{row['found']}  ({row['trials']} trials, {row['wall_s']:.0f} s)",
                  va="center", fontsize=8)
    left.set_xlim(0, edge * 1.6)
    left.invert_yaxis()
    left.set_xlabel("micro-batch found")
    left.set_title("Micro-batch found (one budget)", fontsize=10)
    left.legend(loc="lower right", fontsize=8)

    measured = [row for row in loops if row["median_samples_per_s"]]
    middle.bar([row["loop"].replace(" loop", "\nloop") for row in measured],
               [row["median_samples_per_s"] for row in measured], color=["#2a7", "#58c", "#999"][:len(measured)])
    for x, row in enumerate(measured):
        middle.text(x, row["median_samples_per_s"], f"{row['median_samples_per_s']:.2f}", ha="center", va="bottom",
                    fontsize=8)
    middle.set_ylabel("samples/s (median)")
    middle.set_title("Training loop (same split)", fontsize=10)

    diffs = [row for row in losses if row["max_relative_difference"] is not None]
    right.barh([row["tool"].replace(" (", "\n(") for row in diffs],
               [max(row["max_relative_difference"], 1e-9) for row in diffs],
               color=["#2a7" if row["max_relative_difference"] < 1e-5 else "#c84" for row in diffs])
    right.set_xscale("log")
    right.invert_yaxis()
    right.set_xlabel("max |g - g_large| / max |g_large|")
    right.set_title("Gradient vs the true large batch", fontsize=10)
    return fig


def blocks_for(settings: Settings, command: str, info: dict, finders: list[dict], edge: int, loops: list[dict],
               losses: list[dict]) -> list:
    from gaplan.report import Bullets, Heading, Image, Paragraph, Table

    def ratio(value) -> str:
        return f"{value:.2f}x" if value else ""

    def difference(value) -> str:
        return f"{value:.1e}" if value is not None else ""

    return [
        Heading(1, "gaplan next to accelerate, Lightning, the HF Trainer and a hand-written loop"),
        Paragraph(f"Made by `{command}`. Each measurement ran in its own fresh Python process."),
        Bullets([f"{name} {value}" for name, value in info["versions"].items()]
                + [f"CPU: {info['cpu']}, {info['threads']} torch threads",
                   f"workload: {settings.model}, sequence length {settings.seq_len}, AdamW, fp32; "
                   f"CPU budget {settings.memory_limit}"]),
        Heading(2, "Batch-size finding"),
        Paragraph(f"Every tool's trial runs the same step ({MICRO_STEPS} accumulated micro-batches, then AdamW): "
                  f"gaplan and the accelerate-wrapped function for {TRIAL_OPTIMIZER_STEPS} optimizer steps, Lightning "
                  f"for its default {LIGHTNING_STEPS_PER_TRIAL}. accelerate starts at its default {ACCELERATE_START} "
                  "and multiplies by 0.9 after each OOM; "
                  "Lightning starts at its default 2, and binsearch keeps its default 5% margin. "
                  f"The true edge, {edge}, is checked in fresh processes: {edge} trains {TRIAL_OPTIMIZER_STEPS} "
                  f"optimizer steps and {edge + 1} runs out of memory. \"Trains 2 steps\" checks each tool's "
                  "answer the same way. In *tried*, x marks a trial that ran out of memory."),
        Table(["tool", "found", "true edge", "of edge", "trains 2 steps", "trials", "wall s", "tried"],
              [[row["tool"], str(row["found"] if row["found"] is not None else row["error"]), str(row["true_edge"]),
                row["of_edge"], {True: "yes", False: "no", None: ""}[row["survives_step_2"]], str(row["trials"]),
                f"{row['wall_s']:.1f}", row["tried"]] for row in finders],
              frozenset({1, 2, 3, 5, 6})),
        Heading(2, "Training loop"),
        Paragraph(f"Micro-batch {settings.loop_micro_batch} x {settings.loop_accumulation} accumulation steps "
                  f"({settings.loop_micro_batch * settings.loop_accumulation} samples a step) of padded, varied-length "
                  f"sequences; {settings.loop_warmup} warm-up step(s), then {settings.loop_steps} timed steps; "
                  f"{settings.repeats} run(s) of each, interleaved; samples/s is the median. gaplan's loop is "
                  "`gaplan.train` (what `gaplan train` runs); the Trainer is the stock `transformers.Trainer` with "
                  "sequential sampling; the hand-written loop divides the model's mean loss by the accumulation steps. "
                  "All three clip the gradient norm at 1.0."),
        Table(["loop", "samples/s (median)", "gaplan / this", "runs"],
              [[row["loop"], f"{row['median_samples_per_s']:.2f}" if row["median_samples_per_s"] else row["error"],
                ratio(row["gaplan_ratio"]), row["runs"]] for row in loops], frozenset({1, 2})),
        Heading(2, "Loss correctness"),
        Paragraph(f"{LOSS_EFFECTIVE_BATCH} padded sequences of {LOSS_SEQ_LEN // 4} to {LOSS_SEQ_LEN} tokens as "
                  f"{LOSS_EFFECTIVE_BATCH // LOSS_MICRO_BATCH} micro-batches of {LOSS_MICRO_BATCH}, a 2-layer GPT-2; "
                  "each tool's accumulated gradient against the gradient of the one large batch (the mean over all "
                  "its target tokens)."),
        Table(["tool", "max relative difference"],
              [[row["tool"], difference(row["max_relative_difference"]) or row["error"]] for row in losses],
              frozenset({1})),
        Image("peers.png", "batch size found, loop samples/s and gradient difference per tool"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:6]) + "\n")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "reports", "peers"),
                        help="the report folder (default: reports/peers)")
    parser.add_argument("--quick", action="store_true", help="a small workload and one repeat (a few minutes)")
    parser.add_argument("--repeats", type=int, help="training-loop runs per tool (default 3; 1 with --quick)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in every process (default: torch's own, all cores)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(child(json.loads(options.child))))
        return
    if options.repeats is not None and options.repeats < 1:
        parser.error(f"--repeats must be at least 1 (got {options.repeats})")
    if options.threads < 0:
        parser.error(f"--threads must be 0 (all cores) or more (got {options.threads})")

    for module, package in (("pytorch_lightning", "pytorch-lightning"), ("accelerate", "accelerate")):
        try:
            __import__(module)
        except ImportError:
            parser.exit(2, f"compare_with_peers.py: error: {package} is not installed (pip install -e '.[compare]')\n")
    import torch

    from gaplan.core.units import parse_bytes
    from gaplan.report import render_markdown, write_charts, write_csv, write_pages, write_text

    settings = QUICK if options.quick else FULL
    # Without --threads no process sets a thread count (torch's default, as `gaplan probe` runs).
    threads = options.threads or torch.get_num_threads()
    settings = Settings(**{**settings.__dict__, "threads": options.threads,
                           "repeats": options.repeats or settings.repeats})
    spec = {"model": settings.model, "seq_len": settings.seq_len}
    limit = parse_bytes(settings.memory_limit)
    command = "python examples/compare_with_peers.py" + (" --quick" if options.quick else "") + \
        (f" --repeats {options.repeats}" if options.repeats else "")
    info = {"versions": versions(), "cpu": cpu_name(), "threads": threads, "command": command,
            "settings": settings.__dict__}

    finders, edge = compare_finders(settings, spec, limit)
    loops = compare_loops(settings, spec)
    losses = compare_losses(settings)

    os.makedirs(options.out, exist_ok=True)
    write_csv(options.out, "batch_size.csv", finders)
    write_csv(options.out, "loop.csv", loops)
    write_csv(options.out, "loss.csv", losses)
    images = write_charts(options.out, [("peers.png", figure(finders, edge, loops, losses))])
    blocks = blocks_for(settings, command, info, finders, edge, loops, losses)
    write_pages(options.out, blocks, "gaplan next to its peers", images, stem="peers")
    write_text(options.out, "peers.json", json.dumps(
        {**info, "true_edge": edge, "batch_size": finders, "loop": loops, "loss": losses}, indent=2) + "\n")
    print(render_markdown(blocks[4:]))
    print(f"wrote {options.out}/peers.md, peers.html, peers.png, peers.json and three CSVs")


if __name__ == "__main__":
    main()
