#!/usr/bin/env bash
# The GPU acceptance run: every gpu-marked check once, on one CUDA device, and one row per check.
# Usage (from anywhere, with a CUDA build of torch): bash tests/gpu/gpu_check.sh [TABLE.md]
# Refuses a machine without CUDA (exit 2, one line). Writes the table to TABLE.md (default gpu_check.md in the
# current folder) and to stdout; exits non-zero when a check fails, after the table.
set -uo pipefail
table=$(realpath -m "${1:-gpu_check.md}")
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
header=$(python3 - <<'PY'
import sys

import torch

if not torch.cuda.is_available():
    build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no device visible"
    print(f"gpu_check: no CUDA device here (torch {torch.__version__}, {build}): nothing was checked", file=sys.stderr)
    sys.exit(2)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
PY
) || exit 2
{ echo "$header"; echo; echo "| check | result | measured |"; echo "|---|---|---|"; } > "$table"
# 17 checks, among them an allocator replay, two probes under different allocator settings, the context's size, a 2-rank NCCL trial
# (skipped with one card; issue 45) and two compiled trials (issue 57): 560 s
# leaves the device tool's 600 s a command room for the header and the table.
limit=560
GAPLAN_GPU_TABLE="$table" timeout "$limit" python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu > "$table.log" 2>&1
status=$?
if [ "$status" -eq 124 ]; then echo "| the run | FAIL | stopped after $limit s: the checks without a row did not finish |" >> "$table"; fi
if ! grep -q '^| test' "$table"; then echo "| the run | FAIL | no check ran (exit $status): see $table.log |" >> "$table"; status=1; fi
cat "$table"
echo
echo "log: $table.log"
exit "$status"
