"""A plain Hugging Face loop, as a user writes it: the model's own loss, divided by the accumulation steps.

As functions for ``gaplan.probe_loop`` (``setup``, ``make_batch``, ``micro_step``), and as a script that trains it
in a fresh process under ``gaplan.cpu_budget``: ``python plain_hf_loop.py MICRO_BATCH LIMIT`` exits 0 when two
optimizer steps of two micro-steps train, 3 when it runs out of memory.
"""

import sys

# isort: off
import gaplan  # first: MKL's pooled workspace off before torch loads, as in the probe's trials
import torch
from transformers import GPT2Config, GPT2LMHeadModel  # the model's code, before the budget

# isort: on

SEQ_LEN, ACCUMULATION = 128, 2


def setup():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=SEQ_LEN)
    model = GPT2LMHeadModel(config)
    model.config.use_cache = False
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def make_batch(micro_batch):
    return torch.randint(0, 8192, (micro_batch, SEQ_LEN))


def micro_step(model, x):
    (model(input_ids=x, labels=x).loss / ACCUMULATION).backward()


def main(micro_batch, limit):
    gaplan.cpu_budget(limit)  # after the imports (the model's code too), before the model: as a trial takes it
    model, optimizer = setup()
    try:
        for _ in range(2):
            for _ in range(ACCUMULATION):
                micro_step(model, make_batch(micro_batch))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            raise
        sys.exit(3)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
