"""Throughput bench, tuner choice and memory breakdown on a tiny CPU workload."""

import dataclasses

import pytest

from gaplan.benchmark.splits import (
    LARGE_BATCH,
    PLAN,
    SPLIT,
    BenchResult,
    BenchSettings,
    SplitMeasurement,
    bench,
    candidate_splits,
    neighbouring_splits,
    split_label,
)
from gaplan.benchmark.tuner import choose
from gaplan.core.checkpointing import ON
from gaplan.training.breakdown import CATEGORIES, measure_breakdown
from gaplan.worker.trial import materialize_optimizer_state
from gaplan.workload.build import WorkloadSpec, build_workload


def test_candidate_splits_keep_the_effective_batch():
    splits = candidate_splits(256, 35)
    assert splits[0] == (PLAN, (32,) * 8)
    assert [max(sizes) for _, sizes in splits] == [32, 16, 8, 4, 2, 1]  # caps 35, 17, 8, 4, 2, 1 as even splits
    assert all(sum(sizes) == 256 for _, sizes in splits)
    assert len({sizes for _, sizes in splits}) == len(splits)


ONE_LOOK = BenchSettings(repeats=1, warmup=0, min_rounds=1, max_rounds=1)
ONE_LOOK_ALONE = BenchSettings(repeats=1, warmup=0, min_rounds=1, max_rounds=1, large_batch=False)


def test_by_default_the_plan_is_compared_with_its_two_neighbours_only():
    splits = candidate_splits(256, 35)
    assert neighbouring_splits(splits) == [(PLAN, (32,) * 8), (SPLIT, (16,) * 16), (SPLIT, (8,) * 32)]
    tuned = [(PLAN, (8,) * 32), *[s for s in splits if s[1] != (8,) * 32]]  # a tuner's plan mid-way
    assert [len(s) for _, s in neighbouring_splits(tuned)] == [32, 16, 64]
    assert neighbouring_splits(splits[:1]) == splits[:1]


def test_split_labels_write_uneven_sizes_out():
    assert split_label((32, 32)) == "32 x 2"
    assert split_label((22, 21, 21)) == "22,21,21"
    assert split_label((22, 21, 21), world_size=8) == "22,21,21 x 8 ranks"
    assert split_label((43,) * 4 + (42,) * 3) == "43,43,43,43,42,42,42"
    assert split_label((43,) * 4 + (42,) * 5) == "43 x 4 + 42 x 5"


def test_candidate_splits_over_ranks_are_one_ranks_share():
    splits = candidate_splits(64, 8, world_size=2)  # each rank takes 32 samples per step
    assert splits[0] == (PLAN, (8,) * 4)
    assert [max(sizes) for _, sizes in splits] == [8, 4, 2, 1]
    assert all(sum(sizes) == 32 for _, sizes in splits)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_a_sharded_bench_times_every_rank_and_counts_the_whole_step(tmp_path):
    """FSDP over 2 ranks, E = 8 (4 per rank), B* pretended 2: every run is a 2-rank trial; rows count all 8 samples."""
    from gaplan.core.trial import Trial
    from gaplan.plan.split import make_plan
    from gaplan.runs.probe_result import ProbeResult
    from tests.conftest import SMALL_BUDGET, SMALL_THREADS

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16, parallel="fsdp")
    probed = ProbeResult(workload=spec, device="cpu", memory_limit_bytes=SMALL_BUDGET, margin=0.0,
                         probe_limit_bytes=SMALL_BUDGET, budget_is_default=False, max_micro_batch=2, capped=False,
                         trials=[Trial(2, True, 90 * 2**20), Trial(3, False)], plan=make_plan(8, 2, 2),
                         param_count=5_500_000, static_bytes=42 * 2**20, task="causal-lm", seq_len=16,
                         wall_seconds=1.0, world_size=2, trial_ranks=2)
    result = bench(probed, effective_batch=8, settings=ONE_LOOK, threads=SMALL_THREADS)
    assert [(r.kind, r.split) for r in result.rows] == [
        (PLAN, "2 x 2 x 2 ranks"), (SPLIT, "1 x 4 x 2 ranks"), (LARGE_BATCH, "4 x 1 x 2 ranks")]
    assert all(r.effective_batch == 8 and r.samples_per_s for r in result.rows)
    for row in result.rows:  # tokens of both ranks' full-length batches of seq 16
        assert row.tokens_per_s == pytest.approx(row.samples_per_s * 16, abs=0.1)
    assert result.rows[-1].bounded is False and "timed for reference" in result.rows[-1].note

@pytest.mark.slow
@pytest.mark.distributed
def test_a_replicated_plan_timed_over_its_ranks_runs_ddp_in_every_rank():
    """``over_ranks`` (gaplan plan --measure): a DDP plan over 2 ranks is timed as 2 processes, each with its share
    (4 of E = 8) and DDP's all-reduce; the tokens of both ranks' batches are counted (seq 16 each)."""
    from gaplan.core.trial import Trial
    from gaplan.plan.split import make_plan
    from gaplan.runs.probe_result import ProbeResult
    from tests.conftest import SMALL_BUDGET, SMALL_THREADS

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16)
    probed = ProbeResult(workload=spec, device="cpu", memory_limit_bytes=SMALL_BUDGET, margin=0.0,
                         probe_limit_bytes=SMALL_BUDGET, budget_is_default=False, max_micro_batch=2, capped=False,
                         trials=[Trial(2, True, 90 * 2**20), Trial(3, False)], plan=make_plan(8, 2, 2),
                         param_count=5_500_000, static_bytes=84 * 2**20, task="causal-lm", seq_len=16,
                         wall_seconds=1.0, world_size=2, trial_ranks=1)
    result = bench(probed, effective_batch=8, settings=ONE_LOOK_ALONE, threads=SMALL_THREADS,
                   splits=[(PLAN, (2, 2))], over_ranks=True)
    [row] = result.rows
    assert row.split == "2 x 2 x 2 ranks" and row.effective_batch == 8 and row.samples_per_s
    assert row.tokens_per_s == pytest.approx(row.samples_per_s * 16, abs=0.1), "both ranks ran their share"
    alone = bench(probed, effective_batch=8, settings=ONE_LOOK_ALONE, threads=SMALL_THREADS,
                  splits=[(PLAN, (2, 2, 2, 2))])
    [single] = alone.rows
    assert single.split == "2 x 4" and single.tokens_per_s == pytest.approx(single.samples_per_s * 16, abs=0.1)



@pytest.mark.heavy
@pytest.mark.slow
def test_bench_rows_ratios_and_the_unbounded_large_batch(small_probe):
    # Pretend B* = 2 so that E = 4 does not fit: the large batch then runs without the budget, labelled so.
    probed = dataclasses.replace(small_probe, max_micro_batch=2)
    result = bench(probed, effective_batch=4, settings=BenchSettings(repeats=2, warmup=1, min_rounds=2, max_rounds=2))
    kinds = [r.kind for r in result.rows]
    assert kinds == [PLAN, SPLIT, LARGE_BATCH]
    assert all(r.effective_batch == 4 for r in result.rows)
    assert [(r.micro_batch, r.grad_accum_steps) for r in result.rows] == [(2, 2), (1, 4), (4, 1)]
    large = result.rows[-1]
    assert not large.bounded and not large.fits_budget and "timed for reference" in large.note
    assert large.ratio_to_large_batch == 1.0
    for row in result.rows:
        assert row.rounds == 2 and row.repeats == 4 and row.step_seconds_min <= row.step_seconds_median <= row.step_seconds_max
        assert row.ratio_to_large_batch == pytest.approx(row.samples_per_s / large.samples_per_s, rel=1e-3)
        assert row.tokens_per_s == pytest.approx(row.samples_per_s * 16, abs=0.1)  # full-length batches of seq 16


def row(split, kind, micro, steps, speed):
    return SplitMeasurement(split, kind, micro, steps, micro * steps, 3, 1.0, 1.0, 1.0, speed, None, 1, True, True)


def test_tuner_picks_the_fastest_split_not_the_largest(small_probe):
    measured = BenchResult(64, [row("32 x 2", PLAN, 32, 2, 10.0), row("16 x 4", SPLIT, 16, 4, 12.5),
                                row("8 x 8", SPLIT, 8, 8, 9.0)])
    _, decision = choose("throughput", [(small_probe, measured)])
    assert (decision.micro_batch, decision.grad_accum_steps) == (16, 4)
    assert "16 x 4" in decision.reason and "10.0" in decision.reason
    _, default = choose("max-micro-batch", [(small_probe, None)])
    assert default.micro_batch == small_probe.plan.micro_batch


def test_checkpointing_only_when_larger_and_faster(small_probe):
    on = dataclasses.replace(small_probe, workload=dataclasses.replace(small_probe.workload, grad_checkpointing=ON))
    off_bench = BenchResult(64, [row("32 x 2", PLAN, 32, 2, 10.0)])
    slower = BenchResult(64, [row("64 x 1", PLAN, 64, 1, 8.0)])
    faster = BenchResult(64, [row("64 x 1", PLAN, 64, 1, 11.0)])
    chosen, decision = choose("max-micro-batch", [(small_probe, off_bench), (on, slower)])
    assert not decision.grad_checkpointing and not chosen.workload.grad_checkpointing
    assert "ran slower (64 x 1 at 8.0 samples/s)" in decision.reason
    chosen, decision = choose("max-micro-batch", [(small_probe, off_bench), (on, faster)])
    assert decision.grad_checkpointing and decision.micro_batch == 64


def test_breakdown_matches_the_arithmetic():
    workload = build_workload(WorkloadSpec(model="tiny-gpt2", seq_len=16), "cpu")
    materialize_optimizer_state(workload)
    params = workload.param_count
    tensors = len(list(workload.model.parameters()))
    small, large = measure_breakdown(workload, 2), measure_breakdown(workload, 32)
    for measured in (small, large):
        assert sum(getattr(measured, c) for c in CATEGORIES) == measured.tracked_total
        assert measured.parameters == 4 * params  # fp32 weights (the tied embedding counted once)
        # AdamW: two fp32 states per parameter, plus its 4-byte step counter per parameter tensor
        assert measured.optimizer_states == 8 * params + 4 * tensors
    assert large.activations > 10 * 2**20 > small.activations
