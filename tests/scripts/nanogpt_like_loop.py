"""A loop in nanoGPT's style, written here (nanoGPT is not a dependency): its own small GPT (pre-norm blocks,
``scaled_dot_product_attention``, tied embedding and head), ``configure_optimizers`` with decayed and undecayed
parameter groups for AdamW, the loss divided by the accumulation steps, gradient clipping before the step. AdamW
makes its states lazily at the first ``step()``, as in nanoGPT's own loop.

As functions for ``gaplan.probe_loop`` (``setup``, ``make_batch``, ``micro_step``, ``optimizer_step``), and as a
script that trains it in a fresh process under ``gaplan.cpu_budget``: ``python nanogpt_like_loop.py MICRO_BATCH
LIMIT`` exits 0 when two optimizer steps of two micro-steps train, 3 when it runs out of memory.
"""

import sys

# isort: off
import gaplan  # first: MKL's pooled workspace off before torch loads, as in the probe's trials
import torch
import torch.nn.functional as F
from torch import nn

# isort: on

VOCAB, BLOCK, LAYERS, HEADS, WIDTH, ACCUMULATION = 4096, 128, 4, 4, 256, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(BLOCK, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT ties them

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    def configure_optimizers(self, weight_decay=0.1, lr=6e-4):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def setup():
    torch.manual_seed(0)
    model = GPT()
    return model, model.configure_optimizers()


def make_batch(micro_batch):
    data = torch.randint(0, VOCAB, (micro_batch, BLOCK + 1))
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def micro_step(model, batch):
    x, y = batch
    (model(x, y) / ACCUMULATION).backward()


def optimizer_step(model, optimizer):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main(micro_batch, limit):
    gaplan.cpu_budget(limit)  # after the imports, before the model: as a trial takes it
    model, optimizer = setup()
    from fresh_steps import two_steps_or_exit_3  # beside this script (run as one, its folder is on the path)

    two_steps_or_exit_3(model, optimizer, micro_batch, ACCUMULATION, make_batch, micro_step, optimizer_step)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
