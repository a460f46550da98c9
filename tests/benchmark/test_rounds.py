"""Interleaved rounds and their stopping rule, over recorded trials (no worker: the rounds' logic alone)."""

import pytest

from gaplan.benchmark.measurement import BenchSettings, Job
from gaplan.benchmark.rounds import measurement_rows, run_rounds
from gaplan.benchmark.splits import LARGE_BATCH, PLAN, SPLIT, reference_job
from gaplan.core.trial import Trial

JOBS = [Job(PLAN, (32, 32), True), Job(SPLIT, (16,) * 4, True), Job(LARGE_BATCH, (64,), False, "for reference")]


class RecordedTrials:
    """Trials replayed from a table of step times by split (what a worker measured), and the order they ran in.

    A clock advances by each trial's steps, so the time budget is exercised as on a real run."""

    def __init__(self, seconds_by_micro_batch: dict[int, list[float]], cpu_share: float = 1.9):
        self.seconds = {k: list(v) for k, v in seconds_by_micro_batch.items()}
        self.order: list[int] = []
        self.now = 0.0
        self.cpu_share = cpu_share

    def __call__(self, job: Job) -> Trial:
        micro = max(job.sizes)
        self.order.append(micro)
        step = self.seconds[micro].pop(0)
        if step is None:
            return Trial(micro, False, error="out of memory")
        steps = [2 * step, step, step]  # a slow warm-up step, then two timed ones
        self.now += sum(steps) + 1.0  # and the trial's start
        return Trial(micro, True, 100, sum(steps), step_seconds=steps,
                     step_cpu_seconds=[s * self.cpu_share for s in steps], tokens_per_step=64 * 16)

    def clock(self) -> float:
        return self.now


def _run(trials: RecordedTrials, settings: BenchSettings):
    return run_rounds(JOBS, settings, trials, world=1, reference=reference_job(JOBS, 64), clock=trials.clock)


def test_rounds_interleave_every_split_and_reverse_their_order():
    trials = RecordedTrials({32: [2.0] * 4, 16: [2.2] * 4, 64: [1.9] * 4})
    timings = _run(trials, BenchSettings(min_rounds=4, max_rounds=4))
    assert trials.order == [32, 16, 64, 64, 16, 32, 32, 16, 64, 64, 16, 32]  # ABC CBA ABC CBA, never AAAA
    assert timings.rounds == 4 and "4 rounds" in timings.stopped_because
    assert [len(j.rates) for j in timings.jobs] == [4, 4, 4]
    assert all(len(j.step_seconds) == 8 for j in timings.jobs), "the warm-up step is not timed"


def test_rounds_stop_once_the_plans_ratio_is_known_to_the_target():
    steady = RecordedTrials({32: [2.0, 2.0, 2.01, 2.0, 2.0], 16: [2.2] * 5, 64: [1.9, 1.9, 1.9, 1.9, 1.9]})
    timings = _run(steady, BenchSettings(min_rounds=3, max_rounds=10, ci_target=0.05))
    assert timings.rounds == 3 and "known to ±" in timings.stopped_because
    noisy = RecordedTrials({32: [2.0, 3.1, 1.6, 2.4, 2.0, 1.9, 2.6, 2.0, 2.2, 2.1],
                            16: [2.2] * 10, 64: [1.9, 2.0, 2.5, 1.7, 2.1, 1.9, 2.0, 1.8, 2.2, 2.0]})
    wide = _run(noisy, BenchSettings(min_rounds=3, max_rounds=10, ci_target=0.05))
    assert wide.rounds > 3, "a wide interval takes more rounds"


def test_rounds_stop_before_one_that_would_end_past_the_time_budget():
    trials = RecordedTrials({32: [2.0, 3.0, 2.5, 2.0, 2.8], 16: [2.2] * 5, 64: [1.9, 2.9, 1.5, 2.4, 2.2]})
    # One round: 3 trials of 4 step-lengths plus 1 s each, about 28 s; a 70 s budget holds two, not a third.
    timings = _run(trials, BenchSettings(min_rounds=2, max_rounds=10, time_budget_s=70))
    assert timings.rounds == 2 and "time budget of 70 s" in timings.stopped_because


def test_a_split_that_fails_is_not_run_again_and_its_row_says_why():
    trials = RecordedTrials({32: [2.0] * 3, 16: [None], 64: [1.9] * 3})
    timings = _run(trials, BenchSettings(min_rounds=3, max_rounds=3))
    assert trials.order.count(16) == 1
    rows = measurement_rows(JOBS, timings, timings.reference, 1)
    failed = rows[1]
    assert failed.samples_per_s is None and failed.note == "failed: out of memory"
    assert rows[0].samples_per_s and rows[2].samples_per_s


def test_rows_carry_each_rate_and_ratio_with_its_interval():
    trials = RecordedTrials({32: [2.0, 2.1, 1.9], 16: [2.4, 2.5, 2.3], 64: [1.8, 1.9, 1.8]})
    timings = _run(trials, BenchSettings(min_rounds=3, max_rounds=3))
    plan, split, large = measurement_rows(JOBS, timings, timings.reference, 1)
    assert large.ratio_to_large_batch == 1.0 and (large.ratio_low, large.ratio_high) == (1.0, 1.0)
    assert plan.ratio_to_large_batch == pytest.approx(plan.samples_per_s / large.samples_per_s, rel=1e-3)
    assert plan.ratio_low < plan.ratio_to_large_batch < plan.ratio_high
    assert plan.samples_per_s_low < plan.samples_per_s < plan.samples_per_s_high
    assert plan.rounds == 3 and plan.repeats == 6 and plan.step_seconds_median == 2.0
    assert plan.tokens_per_s == pytest.approx(plan.samples_per_s * 16, abs=0.1)
    assert plan.cpu_per_wall == pytest.approx(1.9) and not plan.bounded
    assert large.note == "for reference" and not large.fits_budget
    summary = timings.summary()
    assert summary["verdict"].startswith("the plan runs at") and "95% CI" in summary["verdict"]
    assert summary["round_rates"]["32 x 2"] == [pytest.approx(32.0), pytest.approx(64 / 2.1, abs=1e-3),
                                                pytest.approx(64 / 1.9, abs=1e-3)]
    assert not summary["contended"]


def test_a_starved_process_is_reported_as_contention():
    trials = RecordedTrials({32: [2.0] * 3, 16: [2.2] * 3, 64: [1.9] * 3}, cpu_share=0.4)
    summary = _run(trials, BenchSettings(min_rounds=3, max_rounds=3)).summary()
    assert summary["contended"] and "0.40 CPU seconds per wall second" in summary["contention"]


def test_the_minimum_rounds_run_even_past_the_time_budget():
    """Without them there is no interval to give a verdict with; the forecast announced them."""
    trials = RecordedTrials({32: [2.0, 3.0, 2.5, 2.0], 16: [2.2] * 4, 64: [1.9, 2.9, 1.5, 2.4]})
    timings = _run(trials, BenchSettings(min_rounds=3, max_rounds=10, time_budget_s=10))
    assert timings.rounds == 3 and "time budget of 10 s" in timings.stopped_because


def test_where_the_plan_is_the_large_batch_the_rule_watches_the_other_splits_ratios_to_it():
    """E fits in one micro-batch: the machine drifts by 30% between rounds, the splits' ratios do not."""
    jobs = [Job(PLAN, (64,), True), Job(SPLIT, (32, 32), True)]
    drift = [2.0, 2.6, 1.7, 2.3, 2.0]
    trials = RecordedTrials({64: drift, 32: [1.1 * d for d in drift]})
    timings = run_rounds(jobs, BenchSettings(min_rounds=3, max_rounds=10), trials, world=1,
                         reference=reference_job(jobs, 64), clock=trials.clock)
    assert timings.reference == 0 and timings.rounds == 3
    assert "every split's ratio to the plan is known" in timings.stopped_because
    assert timings.summary()["verdict"].startswith("the plan is the true large batch")


def test_each_job_is_rated_by_its_own_samples_a_step():
    """The goodput tuner times the plans of several effective batches in one bench: 8 x 1 and 32 x 2 at the same
    step time are 8 and 64 samples a step, so their rates differ by 8x."""
    jobs = [Job(PLAN, (32, 32), True), Job(SPLIT, (8,), True)]
    trials = RecordedTrials({32: [2.0] * 2, 8: [2.0] * 2})
    timings = run_rounds(jobs, BenchSettings(min_rounds=2, max_rounds=2), trials, world=1, reference=None,
                         clock=trials.clock)
    plan, small = measurement_rows(jobs, timings, None, 1)
    assert (plan.effective_batch, small.effective_batch) == (64, 8)
    assert plan.samples_per_s == pytest.approx(32.0) and small.samples_per_s == pytest.approx(4.0)
