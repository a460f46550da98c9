#!/usr/bin/env bash
# Two data-parallel processes on CPU (gloo), each with its share of the effective batch:
# 16 samples per optimizer step = micro-batch 4 x 2 accumulation steps x 2 ranks.
# no_sync() on all but the last micro-step, the target count summed over ranks, DDP's averaging undone.
#   bash examples/ddp_torchrun.sh            (about a minute on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
torchrun --nproc-per-node 2 --master-port "${MASTER_PORT:-29561}" -m gaplan train \
    --seq-len 16 --effective-batch 16 --micro-batch 4 --steps 3 --threads 1 --out "$out/ddp" --quiet --json
