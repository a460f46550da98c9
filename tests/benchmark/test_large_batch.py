"""bench's default run with E > B*: the large batch is a real, separate run, measured without the budget."""

import pytest

from gaplan.benchmark.splits import LARGE_BATCH, PLAN, BenchSettings, bench
from gaplan.core.units import format_bytes


@pytest.mark.heavy
@pytest.mark.slow
def test_a_large_batch_over_the_edge_runs_unbounded_as_its_own_row(small_probe):
    effective = small_probe.max_micro_batch + 1  # one sample more than fits: the plan must accumulate
    result = bench(small_probe, effective_batch=effective,
                   settings=BenchSettings(repeats=1, warmup=0, min_rounds=1, max_rounds=1))
    plan = next(r for r in result.rows if r.kind == PLAN)
    large = [r for r in result.rows if r.kind == LARGE_BATCH]
    assert len(large) == 1, result.rows
    large = large[0]
    assert plan.grad_accum_steps >= 2 and plan.micro_batch <= small_probe.max_micro_batch
    assert (large.micro_batch, large.grad_accum_steps, large.effective_batch) == (effective, 1, effective)
    assert large.micro_batch != plan.micro_batch and large.split != plan.split
    # Really run, and outside the budget.
    assert large.samples_per_s and large.samples_per_s > 0 and large.repeats == 1
    assert large.peak_bytes and large.peak_bytes > plan.peak_bytes
    assert not large.bounded and not large.fits_budget
    assert "timed for reference" in large.note
    assert f"over the {format_bytes(small_probe.probe_limit_bytes)} budget (B* = {small_probe.max_micro_batch})" \
        in large.note
    # It is the reference of the ratios; the plan's ratio is its own measurement, not 1 by construction.
    assert large.ratio_to_large_batch == 1.0
    assert plan.ratio_to_large_batch == pytest.approx(plan.samples_per_s / large.samples_per_s, rel=1e-3)
    # The resident peak reads below the address-space budget, so the note must not present it as what E needs.
    assert "needs" not in large.note
