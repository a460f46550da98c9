"""gaplan.estimate.targets: the known GPUs and what of their memory tensors can use."""

from __future__ import annotations

import json

import pytest

from gaplan.core.errors import GaplanError
from gaplan.estimate import list_targets, lookup_target

from .helpers import one_line


def test_every_target_keeps_a_reserve_and_most_of_its_memory():
    targets = list_targets()
    assert {"h200", "h100-80gb", "a100-80gb", "a100-40gb", "l4", "t4", "rtx-4090"} <= {t.name for t in targets}
    for target in targets:
        assert 0 < target.usable_bytes < target.total_bytes
        assert target.total_bytes - target.usable_bytes == target.context_bytes + target.workspace_bytes
        assert target.usable_bytes > 0.9 * target.total_bytes
        assert json.loads(json.dumps(target.to_dict()))["usable_bytes"] == target.usable_bytes


def test_lookup_target_by_name_and_alias():
    h100 = lookup_target("h100-80gb")
    assert h100.total_bytes == 81_559 * 2**20
    assert lookup_target("H100") is h100
    assert lookup_target("a100_40gb").name == "a100-40gb"
    assert h100.workspace_bytes > lookup_target("a100-80gb").workspace_bytes  # Hopper's 32 MiB cuBLAS workspaces


def test_unknown_target_is_one_line_naming_the_known_ones():
    with pytest.raises(GaplanError) as exc:
        lookup_target("h900")
    message = one_line(exc)
    assert "unknown target 'h900'" in message and "h100-80gb" in message


def test_the_targets_need_no_torch():
    import subprocess
    import sys

    code = "import sys, gaplan.estimate.targets as t; t.list_targets(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
