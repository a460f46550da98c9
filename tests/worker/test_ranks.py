"""Trials over several ranks (FSDP): a failure on one rank ends the trial without a hang; the peak is the largest rank's.

The first tests fork stand-in ranks (no torch in them): one fails while the other waits forever, as a rank
waits in an all-gather its failed peer never joins. The last runs a real 2-rank FSDP2 trial on CPU.
"""

import os
import signal
import time

import pytest

from gaplan.core.trial import Trial
from gaplan.worker.ranks import merge_ready, merge_trials, run_ranks
from tests.conftest import SMALL_BUDGET, SMALL_THREADS


def _wait_forever() -> dict:
    while True:
        time.sleep(60)


def _trial(micro_batch: int, peak: int, **extra) -> dict:
    return Trial(micro_batch, True, peak, 1.0, None, 2, peak - 1, [0.5, 0.5], 100, 10, 10, **extra).to_dict()


def test_a_rank_that_runs_out_of_memory_ends_the_trial_and_its_waiting_peer_is_killed():
    def work(rank: int) -> dict:
        if rank == 1:
            return _wait_forever()  # in a collective its peer will never join
        time.sleep(0.2)
        return Trial(8, False, error="DefaultCPUAllocator: can't allocate memory", completed_steps=1).to_dict()

    started = time.monotonic()
    results = run_ranks(2, work, timeout_s=120)
    assert time.monotonic() - started < 30, "the waiting rank must be killed, not waited for"
    assert results[1]["error"] == "stopped" and "another rank failed first" in results[1]["message"]
    merged = merge_trials(8, results)
    assert merged["fits"] is False and merged["completed_steps"] == 1
    assert merged["error"] == "rank 0: DefaultCPUAllocator: can't allocate memory"


def test_a_rank_killed_by_a_signal_is_reported_as_out_of_memory():
    """SIGKILL from outside (the kernel's OOM killer): no reply, and the trial does not fit."""
    def work(rank: int) -> dict:
        if rank == 0:
            return _wait_forever()
        os.kill(os.getpid(), signal.SIGKILL)
        return {}

    merged = merge_trials(8, run_ranks(2, work, timeout_s=120))
    assert merged == {"micro_batch": 8, "fits": False, "error": "rank 1: trial process killed by SIGKILL"}
    assert Trial.from_dict(merged).fits is False


def test_a_trial_that_hangs_is_killed_at_its_timeout_and_reported_as_a_crash():
    started = time.monotonic()
    results = run_ranks(2, lambda rank: _wait_forever(), timeout_s=1)
    assert time.monotonic() - started < 20
    merged = merge_trials(8, results)
    assert merged["error"] == "crash" and "did not end within 1 s" in merged["message"]


def test_an_error_on_one_rank_is_passed_on_as_it_is():
    def work(rank: int) -> dict:
        if rank == 0:
            raise ValueError("a bug, not memory")
        return _wait_forever()

    merged = merge_trials(4, run_ranks(2, work, timeout_s=120))
    assert merged["error"] == "crash" and "rank 0" in merged["message"] and "a bug, not memory" in merged["message"]


def test_the_merged_trial_takes_the_largest_ranks_peak_and_the_slowest_step():
    small, large = _trial(4, 100), _trial(4, 120)
    small["step_seconds"] = [0.9, 0.2]
    merged = Trial.from_dict(merge_trials(4, [small, large]))
    assert merged.fits and merged.peak_bytes == 120 and merged.micro_steps_peak_bytes == 119
    assert merged.rank_peak_bytes == [100, 120]
    assert merged.step_seconds == [0.9, 0.5] and merged.tokens_per_step == 200


def test_the_ready_message_takes_the_largest_ranks_static_bytes_and_any_rank_that_does_not_fit():
    ready = {"ready": True, "static_bytes": 10, "setup_bytes": 5, "param_count": 7}
    assert merge_ready([ready, dict(ready, static_bytes=12, setup_bytes=4)])["static_bytes"] == 12
    tight = {"error": "does-not-fit", "limit_bytes": 100, "static_bytes": None}
    assert merge_ready([ready, tight])["error"] == "does-not-fit"
    stopped = {"error": "stopped", "message": "rank 0 stopped: another rank failed first"}
    refused = {"error": "user", "message": "--cpu-offload ... leave it out"}
    assert merge_ready([stopped, refused]) == refused, "the failing rank's own error, not its peer's stop"


@pytest.mark.slow
@pytest.mark.distributed
def test_a_two_rank_fsdp_trial_fits_a_small_batch_and_runs_out_of_memory_at_a_large_one_without_hanging():
    """tiny-gpt2, seq 16, 256 MiB per rank: 4 fits on both ranks; 1000 runs out of memory on one, and the trial
    ends (its peer, waiting in a collective, is killed) well within the timeout."""
    from gaplan.worker.client import WorkerProcess
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16, parallel="fsdp")
    with WorkerProcess(spec, "cpu", SMALL_BUDGET, threads=SMALL_THREADS, ranks=2, timeout_s=240) as worker:
        assert worker.info["ready"] and worker.info["param_count"] > 5_000_000
        fits = worker.trial(4, optimizer_steps=2)
        assert fits.fits and fits.completed_steps == 2, fits
        assert len(fits.rank_peak_bytes) == 2 and fits.peak_bytes == max(fits.rank_peak_bytes)
        assert 0 < fits.peak_bytes < SMALL_BUDGET
        started = time.monotonic()
        over = worker.trial(1000, optimizer_steps=2)
        took = time.monotonic() - started
    assert not over.fits and over.peak_bytes is None, over
    assert over.error.startswith("rank ") and "can't allocate memory" in over.error, over.error
    assert took < 120, f"an out-of-memory rank must end the trial at once (took {took:.0f} s)"
