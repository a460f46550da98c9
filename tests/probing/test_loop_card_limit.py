"""``probe_loop``, ``plan_accelerator`` and the Trainer mode take a CUDA ``memory_limit`` as a card's memory."""

from __future__ import annotations

import pytest

from gaplan.core.errors import GaplanError
from gaplan.devices.reserve import CONTEXT_BYTES
from gaplan.probing.loop import resolve_budget
from tests.devices.test_cuda_tripwire import DriverTripwire

GiB = 2**30


def test_a_given_cuda_limit_loses_the_contexts_allowance_and_the_whole_card_does_not(monkeypatch):
    tripwire = DriverTripwire(monkeypatch)
    assert resolve_budget("cuda:0", "8GiB") == 8 * GiB - CONTEXT_BYTES
    assert resolve_budget("cuda:0", None) == 80 * GiB  # the stand-in card, asked in no child here
    assert resolve_budget("cpu", "1GiB") == GiB  # no context on CPU
    with pytest.raises(GaplanError, match="leaves nothing after the CUDA context's allowance"):
        resolve_budget("cuda:0", CONTEXT_BYTES)
    assert tripwire.calls == []
