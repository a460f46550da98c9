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
    from fresh_steps import two_steps_or_exit_3  # beside this script (run as one, its folder is on the path)

    two_steps_or_exit_3(model, optimizer, micro_batch, ACCUMULATION, make_batch, micro_step, optimizer_step)


def optimizer_step(model, optimizer):
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
