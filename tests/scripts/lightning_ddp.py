"""Two ranks of Lightning DDP (torchrun, gloo on CPU) fitting one step with GaplanBatchSize and TokenExactLoss;
rank 1 has the smaller budget. Rank 0 prints each rank's own edge, the edge each took, the split, and the largest
relative difference of the step's synced gradient from one full batch of both ranks' samples.

    torchrun --nproc-per-node 2 tests/scripts/lightning_ddp.py
"""

import json
import os

# isort: off
import gaplan  # noqa: F401 - first: MKL's pooled workspace off before torch loads, as in the probe's trials
import pytorch_lightning as pl
import torch
import torch.distributed as dist
# isort: on

from lightning_gpt import TASK, GptModule, quiet_trainer, tiny_gpt
from noise_by_hand import estimates_by_hand

from gaplan.data import Sample, collate
from gaplan.integrations.lightning import GaplanBatchSize
from gaplan.integrations.lightning_loss import TokenExactLoss
from gaplan.workload.loss import summed_token_loss

EFFECTIVE_BATCH = 64
SEQ_LEN = 128
BUDGETS = (256 << 20, 160 << 20)  # rank 0's, rank 1's


class IndependentDraws(pl.Callback):
    """After TokenExactLoss has read the loader (a shuffling DistributedSampler: an epoch's permutation of N), keep
    what it read and set the meter back to independent draws: the step's reading is then the two-batch estimate the
    hand computes (the finite-population correction is checked in tests/training/test_noise_scale_finite.py)."""

    def __init__(self, exact):
        self.exact = exact
        self.read = None

    def on_train_start(self, trainer, pl_module):
        from gaplan.plan.draws import Drawing

        self.read = (self.exact.meter.drawing.kind, self.exact.meter.drawing.population)
        self.exact.meter.drawing = Drawing()


class SeenSamples(pl.Callback):
    """The samples each micro-batch held (its padding taken off): the DistributedSampler shuffles them."""

    def __init__(self):
        self.samples = []
        self.batches = []  # the same, by micro-batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append([Sample(tuple(ids[mask.bool()].tolist()), 0)
                             for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)])
        self.samples += self.batches[-1]


def main():
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    callback = GaplanBatchSize(EFFECTIVE_BATCH, memory_limit=BUDGETS[rank], threads=1)
    module = GptModule(samples=4 * EFFECTIVE_BATCH, seq_len=SEQ_LEN, fixed_length=False, optimizer="sgd", lr=0.0)
    seen = SeenSamples()
    exact = TokenExactLoss(TASK)
    independent = IndependentDraws(exact)  # after exact: callbacks run in their order
    trainer = quiet_trainer(max_steps=1, devices=2, strategy="ddp", callbacks=[callback, exact, independent, seen])
    trainer.fit(module)
    facts = [None, None]
    reading = (exact.reading.grad_sq, exact.reading.grad_var) if exact.reading is not None else None
    mine = (callback.result.max_micro_batch, callback.max_micro_batch, seen.samples, seen.batches, reading)
    dist.all_gather_object(facts, mine)
    if rank == 0:
        whole = collate([s for f in facts for s in f[2]], TASK)  # both ranks' first step, as one batch
        reference = tiny_gpt(positions=SEQ_LEN)
        targets = (whole["labels"][:, 1:] != -100).sum()
        (summed_token_loss(reference(**whole).logits, whole, TASK) / targets).backward()
        worst = max(((module.step_grads[0][n] - p.grad).abs().max() / p.grad.abs().max()).item()
                    for n, p in reference.named_parameters())
        # The noise estimate of the step by hand: every rank's micro-batches are small batches of the one step.
        def gradient(batches, denominator):
            reference.zero_grad()
            for batch in batches:
                (summed_token_loss(reference(**batch).logits, batch, TASK) / denominator).backward()
            return torch.cat([p.grad.flatten() for p in reference.parameters()])

        micro = [collate(b, TASK) for f in facts for b in f[3]]
        by_hand = estimates_by_hand(gradient, micro, TASK)
        print(json.dumps({"edges": [f[0] for f in facts], "agreed": [f[1] for f in facts],
                          "noise": [f[4] for f in facts], "noise_by_hand": by_hand, "micro_batches": len(micro),
                          "micro_batch": module.batch_size, "accumulate": trainer.accumulate_grad_batches,
                          "effective_batch": EFFECTIVE_BATCH, "global_step": trainer.global_step,
                          "samples": len(whole["input_ids"]), "worst": worst, "drawing": independent.read}))
    # The DDP wrapper holds the gloo group in reference cycles: freed while the interpreter is whole.
    del trainer, module
    import gc

    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
