"""Which builds import bitsandbytes, whose import initializes CUDA on a machine with a card (issue 45, item 4).

bitsandbytes' import calls ``torch.cuda.is_available``, ``device_count`` and ``get_device_capability`` (the last
initializes torch's CUDA): measured in ``tests/workflows/test_lora_seed_tripwire.py``. peft imports bitsandbytes
when it is installed, so ``--lora`` does too, as do QLoRA and the 8-bit optimizers. A process that forks trials
(the probe's worker) or asks the card in a forked child (``gaplan probe``'s own) builds those only in a child.
"""

from __future__ import annotations

import importlib.util

from gaplan.devices.card import imports_bitsandbytes, imports_initialize_cuda
from gaplan.workload.spec import WorkloadSpec


def test_the_builds_that_import_bitsandbytes(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "bitsandbytes" else None)
    for spec in (WorkloadSpec(lora=True), WorkloadSpec(lora=True, quantize="4bit"),
                 WorkloadSpec(optimizer="adamw-8bit"), WorkloadSpec(optimizer="paged-adamw-8bit")):
        assert imports_bitsandbytes(spec), spec
        assert imports_initialize_cuda("cuda:0", spec) and imports_initialize_cuda("cuda", spec)
        assert not imports_initialize_cuda("cpu", spec)  # no card: nothing to initialize
    assert not imports_bitsandbytes(WorkloadSpec()) and not imports_bitsandbytes(WorkloadSpec(optimizer="lion"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # not installed: peft leaves it out
    assert not imports_initialize_cuda("cuda:0", WorkloadSpec(lora=True))
