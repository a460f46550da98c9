#!/usr/bin/env bash
# The GPU acceptance run: every gpu-marked test on one CUDA device, then a table of what each measured.
# Usage (from the repository root, in the venv with a CUDA build of torch): bash tests/gpu/gpu_check.sh
# Takes a few minutes on one GPU; exits non-zero when a check fails (the table still prints).
set -uo pipefail
cd "$(dirname "$0")/../.."
log=$(mktemp)
python - <<'PY'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'}")
PY
timeout 480 python -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu tests/devices 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo
echo "| check | result |"
echo "|---|---|"
grep '^GPU-CHECK |' "$log" | sed 's/^GPU-CHECK //'
grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/| failed | /; s/$/ |/'
exit "$status"
