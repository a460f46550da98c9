"""Constants more than one module needs: one place, one value. No torch."""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30

DEFAULT_CPU_BUDGET = GiB  # the probe's and the estimate's CPU budget when --memory-limit is not given
SEARCH_CAP = 4096  # the search's upper bound when neither the user nor an effective batch gives one
DEFAULT_EFFECTIVE_BATCH = 256
# The help of --effective-batch and --plan, on the fields of every command that takes them.
EFFECTIVE_BATCH_HELP = "Samples per optimizer step."
PLAN_FILE_HELP = "Use a plan written by gaplan probe."

# Rows of a throughput comparison (throughput.csv's ``kind`` column).
PLAN_KIND = "plan"  # the plan's own split
SPLIT_KIND = "split"  # another even split of the effective batch
LARGE_BATCH_KIND = "large-batch"  # the whole effective batch as one micro-batch, no accumulation
LARGEST_FIT_KIND = "largest-fit"  # the largest batch that fits, the reference when the large batch cannot run
TOKEN_PLAN_KIND = "token-plan"  # bench --batch-by tokens: each step packed into micro-batches of at most T* tokens
SAMPLES_PLAN_KIND = "samples-plan"  # bench --batch-by tokens: micro-batches of B* samples (B* at the longest length)

# Memory by category (breakdown.csv's columns), as torch's MemTracker reports it.
BREAKDOWN_CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "other")
DEFAULT_TRAIN_STEPS = 10  # optimizer steps `gaplan train` runs without --steps

# Where the token budget's options apply (their ``applies`` metadata, the docs' tables).
BY_TOKENS = "`--batch-by tokens`"
