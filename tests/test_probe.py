"""The probe on a real CPU budget: exactness in fresh processes, the step-1 trap, no leaks."""

import pytest

from gaplan.probe import WorkerProcess, check_in_fresh_process, load_probe, save_probe
from gaplan.search import trial_bound
from gaplan.workload import WorkloadSpec

from .conftest import SMALL_BUDGET, SMALL_SPEC

pytestmark = pytest.mark.slow


def test_probe_result_is_consistent(small_probe):
    assert small_probe.max_micro_batch >= 2
    fits = {t.micro_batch: t.fits for t in small_probe.trials}
    assert fits[small_probe.max_micro_batch] is True
    assert fits[small_probe.max_micro_batch + 1] is False
    assert sum(not t.fresh_process for t in small_probe.trials) <= trial_bound(small_probe.max_micro_batch)
    assert small_probe.plan.micro_batch <= small_probe.max_micro_batch
    assert sum(small_probe.plan.micro_batch_sizes) == 256


def test_edge_is_exact_in_a_fresh_process(small_probe):
    """B* trains two optimizer steps in a new process under the same budget; B*+1 runs out of memory."""
    spec = WorkloadSpec(**SMALL_SPEC)
    edge = small_probe.max_micro_batch
    assert check_in_fresh_process(spec, "cpu", SMALL_BUDGET, edge, optimizer_steps=2)
    assert not check_in_fresh_process(spec, "cpu", SMALL_BUDGET, edge + 1, optimizer_steps=2)


def test_step_one_trap(small_probe):
    """Measuring one step from a cold optimizer would accept B*+1; it fails at step 2. gaplan does not pick it."""
    spec = WorkloadSpec(**SMALL_SPEC)
    too_big = small_probe.max_micro_batch + 1
    with WorkerProcess(spec, "cpu", SMALL_BUDGET, warm_optimizer=False) as cold:
        first = cold.trial(too_big, optimizer_steps=1)
        assert first["fits"], "one step from a cold optimizer should pass: that is the trap"
        second = cold.trial(too_big, optimizer_steps=1)
        assert not second["fits"], "the second step, with AdamW states allocated, must run out of memory"


def test_failed_trial_leaves_no_leak(small_probe):
    spec = WorkloadSpec(**SMALL_SPEC)
    with WorkerProcess(spec, "cpu", SMALL_BUDGET) as worker:
        baseline = worker.trial(1)
        failed = worker.trial(small_probe.max_micro_batch * 4)
        assert not failed["fits"]
        assert failed["after_bytes"] - failed["before_bytes"] < 16 * 2**20  # 4% of the budget: allocator slack
        assert failed["after_bytes"] - baseline["after_bytes"] < 4 * 2**20
        # The process keeps training after an OOM. (The exact edge itself is confirmed in a fresh
        # process by the probe: freed small-allocation heap can stay counted against RLIMIT_DATA.)
        again = worker.trial(small_probe.max_micro_batch * 9 // 10)
        assert again["fits"], "the process must recover after an OOM"


def test_plan_file_round_trip(small_probe, tmp_path):
    path = tmp_path / "plan.json"
    save_probe(small_probe, str(path))
    loaded = load_probe(str(path))
    assert loaded.plan == small_probe.plan
    assert loaded.max_micro_batch == small_probe.max_micro_batch
    assert loaded.workload == small_probe.workload
