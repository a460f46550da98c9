"""Replay one random sequence of CUDA allocations and frees through torch's caching allocator and through
gaplan's replay of it (gaplan.estimate.allocator.CachingAllocator); print one JSON line: the steps where the two
reserved totals differ, and the largest reserved total. Run in a fresh process: nothing else may hold blocks."""

from __future__ import annotations

import json
import random
import sys

import torch

from gaplan.core.constants import MiB
from gaplan.estimate.allocator import CachingAllocator


def main(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    replay, tensors, live = CachingAllocator(), {}, []
    torch.cuda.init()
    base = torch.cuda.memory_reserved()
    differ = []
    for step in range(steps):
        if live and rng.random() < 0.45:
            key = live.pop(rng.randrange(len(live)))
            del tensors[key]
            replay.free(key)
        else:
            nbytes = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MiB), rng.randrange(1, 40 * MiB)])
            tensors[step] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            replay.alloc(step, nbytes)
            live.append(step)
        real = torch.cuda.memory_reserved() - base
        if real != replay.reserved:
            differ.append([step, real, replay.reserved])
    print(json.dumps({"seed": seed, "steps": steps, "differ": differ[:5], "differing_steps": len(differ),
                      "peak_reserved": replay.peak_reserved}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
