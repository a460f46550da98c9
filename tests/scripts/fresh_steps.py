"""The measured part of a loop script run in a fresh process: two optimizer steps of ``accumulation`` micro-steps;
out of memory (the CPU budget's allocator message) exits 3, anything else is raised."""

import sys


def two_steps_or_exit_3(model, optimizer, micro_batch, accumulation, make_batch, micro_step, optimizer_step):
    try:
        for _ in range(2):
            for _ in range(accumulation):
                micro_step(model, make_batch(micro_batch))
            optimizer_step(model, optimizer)
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            raise
        sys.exit(3)
