"""A LightningModule as its users write one (a tiny GPT-2, its own train_dataloader with a batch_size field, the
summed token loss), for the Lightning tests. Run as a script, a fresh process (a user's training script) either
trains ``fit`` once under ``gaplan.cpu_budget``, or fits with ``GaplanBatchSize`` (``--probe E``, the budget the
probe's), and prints what happened as JSON:

    python tests/scripts/lightning_gpt.py --batch 12 --accumulate 4 --budget 268435456
    python tests/scripts/lightning_gpt.py --probe 64 --budget 268435456
"""

import argparse
import json

# isort: off
import gaplan  # first: MKL's pooled workspace off before torch loads, as in the probe's trials
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel  # the model's code imported here: it is not training memory
# isort: on

from gaplan.data import SyntheticCorpus, collate
from gaplan.workload.loss import summed_token_loss

TASK = "causal-lm"
VOCAB = 2048


def tiny_gpt(vocab=VOCAB, positions=128):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=vocab, n_positions=positions, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


class FixedLength(torch.utils.data.Dataset):
    """Samples of one length: every batch is the worst case, so an edge measured on one holds for all."""

    def __init__(self, size, seq_len):
        self.size, self.seq_len = size, seq_len

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        ids = torch.randint(1, VOCAB, (self.seq_len,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


class GptModule(pl.LightningModule):
    def __init__(self, batch_size=4, samples=64, seq_len=128, fixed_length=True, lr=1e-3, optimizer="adamw",
                 summed=True):
        super().__init__()
        self.batch_size, self.samples, self.seq_len, self.fixed_length = batch_size, samples, seq_len, fixed_length
        self.lr, self.optimizer_name, self.summed = lr, optimizer, summed
        self.model = tiny_gpt(positions=max(seq_len, 32))
        self.step_grads = []  # each optimizer step's gradient, as the optimizer sees it (after TokenExactLoss)

    def train_dataloader(self):
        if self.fixed_length:
            return DataLoader(FixedLength(self.samples, self.seq_len), batch_size=self.batch_size)
        corpus = SyntheticCorpus(self.seq_len, seed=0)  # lengths from a quarter of seq_len to all of it: padded
        samples = [corpus[i] for i in range(self.samples)]
        return DataLoader(samples, batch_size=self.batch_size, collate_fn=lambda s: collate(s, TASK))

    def training_step(self, batch, batch_idx):
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if self.summed:  # for TokenExactLoss: the sum of the token losses
            return summed_token_loss(logits, batch, TASK)
        return self.model(**batch).loss  # the per-micro-batch mean Lightning users write

    def on_before_optimizer_step(self, optimizer):
        if self.optimizer_name == "sgd":  # the exactness tests keep the gradients (lr 0)
            self.step_grads.append({n: p.grad.detach().clone() for n, p in self.model.named_parameters()})

    def configure_optimizers(self):
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.parameters(), lr=self.lr)
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def quiet_trainer(**options):
    defaults = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0)
    return pl.Trainer(**{**defaults, **options})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--probe", type=int, help="fit with GaplanBatchSize for this effective batch instead")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--budget", type=int, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.probe:
        from gaplan.integrations.lightning import GaplanBatchSize

        callback = GaplanBatchSize(args.probe, memory_limit=args.budget, threads=args.threads)
        module = GptModule(samples=2 * args.probe, seq_len=args.seq_len)
        trainer = quiet_trainer(max_steps=args.steps, callbacks=[callback])
        trainer.fit(module)
        print(json.dumps({"edge": callback.max_micro_batch, "plan": callback.plan.to_dict(),
                          "trials": [t.to_dict() for t in callback.result.trials], "batch_size": module.batch_size,
                          "accumulate": trainer.accumulate_grad_batches, "global_step": trainer.global_step,
                          "loader_batch_size": trainer.train_dataloader.batch_size}))
        return
    trainer = quiet_trainer(max_steps=args.steps, accumulate_grad_batches=args.accumulate)
    meter = gaplan.cpu_budget(args.budget)  # after the imports and the Trainer, before the model: as a trial
    module = GptModule(batch_size=args.batch, samples=args.batch * args.accumulate * args.steps, seq_len=args.seq_len)
    try:
        trainer.fit(module)
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            raise
        print(json.dumps({"fits": False, "error": str(exc).splitlines()[0][:200]}))
        return
    print(json.dumps({"fits": True, "global_step": trainer.global_step, "peak_bytes": meter.peak_bytes()}))


if __name__ == "__main__":
    main()
