"""``gaplan probe --lora`` on CUDA: the estimate that seeds the search imports no bitsandbytes in the probing process.

The seed is traced in ``gaplan probe``'s (and ``gaplan train``'s) own process, and a LoRA model's build imports peft,
which imports bitsandbytes, whose import asks the card for its compute capability: torch's CUDA is then initialized
in a process that later forks children (the card's questions, :func:`gaplan.devices.card.cuda_cards`). With a card
(here a tripwire: torch's driver functions replaced by recorders that answer as one card would), the seed is traced
in a forked child instead, and this process records no call; the same import done here afterwards records them, so
the test can fail. In a fresh interpreter: an import done by an earlier test would record nothing.
"""

from __future__ import annotations

import pytest

from tests.cuda_standin import run_with_standin

SCRIPT = r"""
import json, os, sys

real_fork = os.fork


def fork():
    pid = real_fork()
    if pid == 0:  # the child is not under test: it gets this CPU machine's own torch.cuda back
        for name, function in originals.items():
            setattr(torch.cuda, name, function)
    return pid


os.fork = fork
from gaplan.devices import card

card._asked = card.CudaCards(("stand-in card",), (80 * 2**30,), (79 * 2**30,), "12.8")
from gaplan.workflows.probe import estimate_start
from gaplan.workload.spec import WorkloadSpec

said = []
start = estimate_start(WorkloadSpec(model="tiny-gpt2", seq_len=8, lora=True), "cuda", 2**30, 0.0, 2, 1, said.append)
parent = list(calls)
loaded = "bitsandbytes" in sys.modules or "peft" in sys.modules
try:
    import peft  # noqa: F401  the control
except AttributeError:  # bitsandbytes, told a card is there, reaches for torch's CUDA ops: this build has none
    pass
print("RESULT " + json.dumps({"calls": parent, "start": start, "said": said, "loaded": loaded,
                              "control": calls[len(parent):]}))
"""


@pytest.mark.heavy  # a fresh interpreter that imports peft twice over and traces: ~30 s on 2 shared cores
def test_the_lora_seed_estimate_on_cuda_imports_bitsandbytes_only_in_a_child():
    pytest.importorskip("bitsandbytes")
    result, _ = run_with_standin(SCRIPT, timeout=300)
    assert result["calls"] == [] and not result["loaded"]  # neither peft nor bitsandbytes was imported here
    assert result["start"] == 2 and "starting the search there" in result["said"][0]  # traced, in the child
    assert "get_device_capability" in result["control"]  # the import, done here, initializes CUDA
