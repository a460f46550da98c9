"""A user's loop at its smallest, for the tests of ``probe_loop`` and its CUDA paths: module-level functions, so a
spawned trial can import them by name (``tests.tiny_loop:setup``)."""

import torch


def setup():
    model = torch.nn.Linear(8, 8)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def make_batch(size):
    return torch.randn(size, 8)


def micro_step(model, batch):
    model(batch).sum().backward()
