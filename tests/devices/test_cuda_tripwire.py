"""A stand-in for the CUDA driver (no GPU here): a process that forks trials must never touch the driver.

On a GPU, any of ``torch.cuda.is_available`` (without NVML), ``device_count``, ``get_device_properties``,
``mem_get_info``, ``current_device``, ``set_device`` or ``init`` starts the driver, and every trial forked after that
fails with "CUDA error: initialization error". Here each of them is replaced by a recorder that answers as one card
would; the card's own answers (asked in a child by :func:`gaplan.devices.card.cuda_cards`) are a stand-in too; and
``os.fork`` forks a child that exits at once, so each path runs in this process up to its first trial and stops
there. Every parent path is driven with ``device="cuda"``: the worker's setup and ready step, ``probe_loop`` (closures
and ``module:function``), ``plan_accelerator``, the Trainer mode and ``gaplan probe``'s own parent. None may call the
driver. (That the answers come back from a real child is tested below, with the stand-ins inherited by the fork.)
"""

from __future__ import annotations

import gc
import io
import json
import os

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.devices import card
from gaplan.devices.card import CudaCards
from tests.tiny_loop import setup

GiB = 2**30
DRIVER = ("is_available", "device_count", "get_device_properties", "mem_get_info", "current_device", "set_device",
          "init", "get_device_name", "get_device_capability", "is_bf16_supported", "synchronize")
STAND_IN_CARD = CudaCards(("stand-in card",), (80 * GiB,), (79 * GiB,), "12.8")


class DriverTripwire:
    """Records every call of the driver's functions; forks children that exit at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.forks = 0
        properties = type("Properties", (), {"total_memory": 80 * GiB, "name": "stand-in card", "major": 9,
                                             "minor": 0})
        answers = {"is_available": True, "device_count": 1, "get_device_properties": properties,
                   "mem_get_info": (79 * GiB, 80 * GiB), "current_device": 0, "get_device_name": "stand-in card",
                   "get_device_capability": (9, 0), "is_bf16_supported": True}
        for name in DRIVER:
            monkeypatch.setattr(torch.cuda, name, self._recorder(name, answers.get(name)))
        monkeypatch.setattr(card, "_asked", STAND_IN_CARD)
        real_fork = os.fork

        def fork() -> int:
            self.forks += 1
            pid = real_fork()
            if pid == 0:
                os._exit(0)  # the trial never runs: the parent's path up to here is what is under test
            return pid

        monkeypatch.setattr(os, "fork", fork)

    def _recorder(self, name: str, answer: object):
        def call(*args: object, **kwargs: object) -> object:
            self.calls.append(name)
            return answer

        return call


@pytest.fixture
def tripwire(monkeypatch):
    return DriverTripwire(monkeypatch)


def test_the_worker_sets_up_and_asks_its_ready_message_without_the_driver(tripwire):
    from gaplan.worker.protocol import WorkerSetup
    from gaplan.worker.serve import _serve
    from gaplan.workload.spec import WorkloadSpec

    setup = WorkerSetup(WorkloadSpec(model="tiny-gpt2", seq_len=16).to_dict(), "cuda:0", 8 * GiB)
    replies: list[dict] = []
    try:
        _serve(io.StringIO(json.dumps(setup.to_dict()) + "\n"), replies.append)
    finally:
        gc.unfreeze()
    assert tripwire.calls == [] and tripwire.forks == 1  # the ready message is asked of a child
    assert not replies[0].get("ready")  # the child exited at once: no answer, and no trial after it


@pytest.mark.parametrize("functions", [
    (setup, lambda b: torch.randn(b, 8), lambda model, x: model(x).sum().backward()),
    tuple(f"tests.tiny_loop:{name}" for name in ("setup", "make_batch", "micro_step")),
], ids=["closures", "module:function"])
def test_probe_loop_on_cuda_forks_its_trials_without_the_driver(tripwire, functions):
    import gaplan

    with pytest.raises(GaplanError, match="a trial of your loop failed at micro-batch 1"):
        gaplan.probe_loop(*functions, device="cuda", effective_batch=8)
    assert tripwire.calls == [] and tripwire.forks >= 2  # the thread check, then the first trial


def test_plan_accelerator_on_cuda_forks_its_trials_without_the_driver(monkeypatch):
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    from gaplan.integrations.accelerate import plan_accelerator

    AcceleratorState._reset_state(True)
    accelerator = accelerate.Accelerator(cpu=True)
    accelerator.state.device = torch.device("cuda", 0)  # as a single-GPU Accelerator has it
    tripwire = DriverTripwire(monkeypatch)
    try:
        with pytest.raises(GaplanError, match="a trial of your loop failed at micro-batch 1"):
            plan_accelerator(accelerator, setup, lambda b: torch.randn(b, 8),
                             lambda model, x: model(x).sum().backward(), effective_batch=8)
    finally:
        AcceleratorState._reset_state(True)
    assert tripwire.calls == [] and tripwire.forks >= 2


def test_the_trainer_mode_on_cuda_forks_its_trials_without_the_driver(monkeypatch, tmp_path):
    transformers = pytest.importorskip("transformers")
    from gaplan.integrations.trainer_probe import probe_trainer

    args = transformers.TrainingArguments(str(tmp_path), report_to=[])  # built before the card is stood in
    rows = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}] * 4
    tripwire = DriverTripwire(monkeypatch)
    with pytest.raises(GaplanError, match="a trial of your loop failed at micro-batch 1"):
        probe_trainer(setup, args, rows, effective_batch=8)
    assert tripwire.calls == [] and tripwire.forks >= 2
    # Arguments given as the function that builds them are built in a child (it answers use_cpu), never here.
    built: list[object] = []
    with pytest.raises(GaplanError, match="the function that builds the TrainingArguments, failed"):
        probe_trainer(setup, lambda: built.append(1), rows, effective_batch=8)
    assert tripwire.calls == [] and built == []


def test_gaplan_probe_resolves_cuda_and_its_budget_without_the_driver(tripwire, monkeypatch):
    import gaplan.probing.edge as probing
    from gaplan.workload.spec import WorkloadSpec

    seen = {}

    class WorkerStandIn:  # records what the worker would get, then stops the probe
        def __init__(self, spec, device, limit_bytes, **options):
            seen.update(device=device, limit=limit_bytes)
            raise KeyboardInterrupt

    monkeypatch.setattr(probing, "WorkerProcess", WorkerStandIn)
    with pytest.raises(KeyboardInterrupt):
        probing.probe(WorkloadSpec(seq_len=16), device="cuda", margin=0.1)
    assert seen == {"device": "cuda:0", "limit": int(80 * GiB * 0.9)}  # --margin applies to the whole card
    assert tripwire.calls == [] and os.environ.get(card.NVML_CHECK) == "1"


def test_the_cards_are_asked_in_a_child_and_the_answers_come_back(monkeypatch):
    """The driver's stand-ins are inherited by the forked child, which calls them; this process calls none."""
    calls: list[str] = []
    properties = type("Properties", (), {"total_memory": 24 * GiB, "name": "stand-in card", "major": 8, "minor": 6})
    for name, answer in {"is_available": True, "device_count": 2, "get_device_properties": properties,
                         "mem_get_info": (20 * GiB, 24 * GiB)}.items():
        monkeypatch.setattr(torch.cuda, name, lambda *a, _name=name, _answer=answer: calls.append(_name) or _answer)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(card, "_asked", None)
    cards = card.cuda_cards()
    assert cards == CudaCards(("stand-in card",) * 2, (24 * GiB,) * 2, (20 * GiB,) * 2, "12.8", ("8.6",) * 2,
                              card.driver_version())  # no NVML or libcuda here: None, asked in the child too
    assert calls == []  # all four were called, in the child
    assert card.cuda_cards() is cards  # once per process
    with pytest.raises(GaplanError, match="only 2 CUDA device"):
        cards.index_of("cuda:2")


def test_a_cpu_only_build_has_no_cards_and_forks_nothing(monkeypatch):
    monkeypatch.setattr(card, "_asked", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("a CPU-only build has nothing to ask"))
    assert card.cuda_cards().count == 0
    from gaplan.devices.backend import resolve_device

    assert resolve_device("auto") == "cpu"
    with pytest.raises(GaplanError, match="no CUDA device is available"):
        resolve_device("cuda")
