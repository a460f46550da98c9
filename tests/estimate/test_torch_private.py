"""gaplan.estimate.torch_private: a torch without an internal the trace needs gives one clear line."""

from __future__ import annotations

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.estimate.torch_private import private, private_attr, private_module

from .helpers import one_line


def test_missing_module_and_attribute_name_themselves_and_the_torch_version():
    with pytest.raises(GaplanError) as exc:
        private_module("torch._no_such_module")
    assert f"needs torch's torch._no_such_module (missing in torch {torch.__version__})" in one_line(exc)
    with pytest.raises(GaplanError) as exc:
        private("torch.utils._python_dispatch", "_no_such_function")
    assert "torch.utils._python_dispatch._no_such_function" in one_line(exc)
    with pytest.raises(GaplanError) as exc:
        private_attr(torch.nn.Module, "_no_such_method")
    assert "Module._no_such_method" in one_line(exc)


@pytest.mark.parametrize(("owner", "name", "label"), [
    ("MemTracker", "_update_peak_stats", "MemTracker._update_peak_stats"),
    ("module", "_TOTAL_KEY", "torch.distributed._tools.mem_tracker._TOTAL_KEY"),
    ("_WeakRefInfo", "_calculate_mem_consumed", "_WeakRefInfo._calculate_mem_consumed"),
])
def test_a_trace_without_a_patched_memtracker_internal_stops_with_one_line(monkeypatch, owner, name, label):
    from torch.distributed._tools import mem_tracker

    from gaplan.estimate import trace_steps
    from gaplan.workload.build import WorkloadSpec

    monkeypatch.delattr(mem_tracker if owner == "module" else getattr(mem_tracker, owner), name)
    with pytest.raises(GaplanError) as exc:
        trace_steps(WorkloadSpec(model="tiny-gpt2", seq_len=16), [1], device_kind="cuda")
    message = one_line(exc)
    assert message.startswith(f"gaplan estimate needs torch's {label} (missing in torch {torch.__version__})"), message
