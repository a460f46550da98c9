"""GaplanBatchSize next to Lightning's own BatchSizeFinder (binsearch) on one LightningModule, in one run.

    python examples/lightning_batch_size.py             # GPT-2 2 x 64, vocab 2048, seq 128, 256 MiB (~1 min)
    python examples/lightning_batch_size.py --budget 512MiB --seq-len 256

Each finder runs in a fresh process, as a user's script: BatchSizeFinder in a process under ``gaplan.cpu_budget``
(it tries sizes in the process itself and catches the allocator's error), GaplanBatchSize with the same budget
for its trials. Each answer is then trained by ``fit`` in a new process under the budget, at steady state (two
optimizer steps of ``--accumulate`` micro-batches), to see whether it really fits. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def build_module(batch_size: int, seq_len: int, samples: int):
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, Dataset
    from transformers import GPT2Config, GPT2LMHeadModel

    class Tokens(Dataset):
        def __len__(self):
            return samples

        def __getitem__(self, index):
            ids = torch.randint(1, 2048, (seq_len,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    class Gpt(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = batch_size
            torch.manual_seed(0)
            self.model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=2048,
                                                    n_positions=seq_len, bos_token_id=0, eos_token_id=0))

        def train_dataloader(self):
            return DataLoader(Tokens(), batch_size=self.batch_size)

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return Gpt()


def trainer(**options):
    import pytorch_lightning as pl

    return pl.Trainer(**{"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
                         "enable_progress_bar": False, "enable_model_summary": False, **options})


def child(args: argparse.Namespace) -> dict:
    """One finder, or one check, in this (fresh) process."""
    import pytorch_lightning as pl
    import torch
    from transformers import GPT2LMHeadModel  # noqa: F401 - the model's code imported before any budget

    import gaplan  # first: MKL's pooled workspace off before torch loads, as in the probe's trials

    torch.set_num_threads(1)
    from gaplan.core.units import parse_bytes

    budget = parse_bytes(args.budget)
    if args.role == "gaplan":
        from gaplan.integrations.lightning import GaplanBatchSize

        callback = GaplanBatchSize(args.effective_batch, memory_limit=budget, threads=1)
        module = build_module(2, args.seq_len, 4 * args.effective_batch)
        started = time.perf_counter()
        trainer(max_steps=0, callbacks=[callback]).fit(module)
        return {"seconds": time.perf_counter() - started, "batch": callback.max_micro_batch,
                "trials": len(callback.result.trials)}
    if args.role == "lightning":
        fit_trainer = trainer(max_steps=0, callbacks=[pl.callbacks.BatchSizeFinder(mode="binsearch")])
        gaplan.cpu_budget(budget)  # BatchSizeFinder's trials run here: this process holds the budget
        module = build_module(2, args.seq_len, 1 << 14)
        started = time.perf_counter()
        fit_trainer.fit(module)
        return {"seconds": time.perf_counter() - started, "batch": module.batch_size}
    fit_trainer = trainer(max_steps=2, accumulate_grad_batches=args.accumulate)
    gaplan.cpu_budget(budget)
    module = build_module(args.batch, args.seq_len, 2 * args.accumulate * args.batch)
    try:
        fit_trainer.fit(module)
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            raise
        return {"fits": False}
    return {"fits": fit_trainer.global_step == 2}


def run(role: str, args: argparse.Namespace, *extra: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--role", role, "--budget", args.budget, "--seq-len",
               str(args.seq_len), "--effective-batch", str(args.effective_batch), "--accumulate",
               str(args.accumulate), *extra]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{role} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="256MiB", help="the memory budget of every run (default 256MiB)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--effective-batch", type=int, default=256, help="GaplanBatchSize's effective batch")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step of the fit checks")
    parser.add_argument("--role", choices=("gaplan", "lightning", "fit"), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        print(json.dumps(child(args)))
        return
    results = {"gaplan": run("gaplan", args), "lightning": run("lightning", args)}
    print(f"budget {args.budget}, GPT-2 2 x 64, vocab 2048, seq {args.seq_len}, AdamW, 1 thread")
    print(f"{'finder':<30} {'wall':>8} {'batch':>6}  fit at it (2 steps x {args.accumulate} micro-batches)")
    for name, label in (("lightning", "Lightning BatchSizeFinder"), ("gaplan", "gaplan GaplanBatchSize")):
        result = results[name]
        fits = run("fit", args, "--batch", str(result["batch"]))["fits"]
        print(f"{label:<30} {result['seconds']:>7.1f}s {result['batch']:>6}  {'trains' if fits else 'out of memory'}")
    edge = results["gaplan"]["batch"]
    above = run("fit", args, "--batch", str(edge + 1))["fits"]
    print(f"gaplan's edge + 1 ({edge + 1}): {'trains' if above else 'out of memory'}")
    print(f"gaplan / Lightning wall time: {results['gaplan']['seconds'] / results['lightning']['seconds']:.2f}x")


if __name__ == "__main__":
    main()
