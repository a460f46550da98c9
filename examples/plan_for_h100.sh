#!/usr/bin/env bash
# Plan a Llama-2-7B-shaped model for an H100 80 GB you don't have: gaplan estimate traces one
# training step on fake tensors (nothing is allocated: a few hundred MiB of RAM, under a minute).
# The config is written here from the published shape; no weights are downloaded.
#   bash examples/plan_for_h100.sh [TARGET] [SEQ_LEN]
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-h100-80gb}"
seq_len="${2:-2048}"
config_dir="$(mktemp -d)"
python - "$config_dir" <<'PY'
import sys

from transformers import LlamaConfig

LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
            architectures=["LlamaForCausalLM"]).save_pretrained(sys.argv[1])
PY
# AdamW needs 16 bytes per parameter before any activation (108 GB for 6.7B): it cannot fit 80 GB.
# SGD without momentum keeps no state: weights + gradients + activations.
gaplan estimate --target "$target" --model "$config_dir" --seq-len "$seq_len" --dtype bf16 \
    --optimizer sgd --effective-batch 512
gaplan estimate --target "$target" --model "$config_dir" --seq-len "$seq_len" --dtype bf16 --effective-batch 512 \
    || echo "(with AdamW the 7B shape does not fit $target: see the line above)"
