"""The probe's worker keeps CUDA uninitialized until its trials fork."""

import importlib.util

from gaplan.worker.serve import _imports_initialize_cuda
from gaplan.workload.spec import WorkloadSpec


def test_a_lora_model_is_built_in_the_trial_children_on_cuda_when_bitsandbytes_is_installed(monkeypatch):
    """bitsandbytes' import asks each card for its compute capability, which initializes CUDA, and peft imports it.
    A stand-in for the installed packages (find_spec): the decision is under test, not the import (no GPU here)."""
    lora, plain = WorkloadSpec(lora=True), WorkloadSpec()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "bitsandbytes" else None)
    assert _imports_initialize_cuda("cuda:0", lora)
    assert not _imports_initialize_cuda("cpu", lora)  # no card to initialize: imported once, before the budget
    assert not _imports_initialize_cuda("cuda:0", plain)  # no peft
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert not _imports_initialize_cuda("cuda:0", lora)

