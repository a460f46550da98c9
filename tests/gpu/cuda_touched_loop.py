"""A user's script that touches CUDA before it probes (``test_gpu.py`` runs it in its own process, on a card).

It moves a tensor to the card first, so its process holds a CUDA context and cannot fork trials; ``probe_loop``
must then spawn them with these module-level functions pickled, and say so once. Prints the result as JSON.
"""

import json

import torch

import gaplan

WIDTH = 1024


def setup():
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.ReLU(), torch.nn.Linear(4 * WIDTH, WIDTH))
    model = model.cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def make_batch(size):
    return torch.randn(size, WIDTH, device="cuda")


def micro_step(model, batch):
    model(batch).square().mean().backward()


if __name__ == "__main__":
    torch.zeros(1, device="cuda")  # the caller's own context, before the probe
    assert torch.cuda.is_initialized()
    result = gaplan.probe_loop(setup, make_batch, micro_step, device="cuda", memory_limit="1GiB", effective_batch=16)
    print(json.dumps({"spawned": result.spawned, "notes": result.notes, "max_micro_batch": result.max_micro_batch,
                      "trials": [t.to_dict() for t in result.trials]}))
