"""The tuner end to end on a tiny CPU workload: ``--objective throughput`` and ``--grad-checkpointing auto``."""

import pytest

import gaplan.benchmark.tuner
from gaplan.benchmark.splits import PLAN, SPLIT, BenchSettings
from gaplan.benchmark.tuner import tune
from gaplan.core.checkpointing import OFF, ON
from gaplan.workload.spec import WorkloadSpec
from tests.conftest import SMALL_BUDGET, SMALL_SPEC

ONE_LOOK = BenchSettings(repeats=1, min_rounds=1, max_rounds=1)


@pytest.mark.heavy
@pytest.mark.slow
def test_throughput_objective_plans_with_the_fastest_measured_split():
    stages = []
    tuned = tune(WorkloadSpec(**SMALL_SPEC, optimizer="sgd"), objective="throughput", device="cpu",
                 memory_limit=SMALL_BUDGET, effective_batch=4, bench_settings=ONE_LOOK, on_stage=stages.append)
    decision, result = tuned.decision, tuned.result
    assert len(tuned.benches) == 1
    rows = [r for r in tuned.benches[0].rows if r.kind in (PLAN, SPLIT) and r.fits_budget and r.samples_per_s]
    assert len(rows) == 3, rows  # 4 x 1, 2 x 2, 1 x 4: every even split of 4 fits 256 MiB
    assert all(r.effective_batch == 4 for r in rows)
    fastest = max(rows, key=lambda r: r.samples_per_s)
    assert (decision.micro_batch, decision.grad_accum_steps) == (fastest.micro_batch, fastest.grad_accum_steps)
    assert decision.samples_per_s == fastest.samples_per_s
    assert fastest.split in decision.reason and decision.objective == "throughput"
    # The chosen plan is that split, keeps E, and is recorded for plan.json.
    assert result.plan.effective_batch == 4 and sum(result.plan.micro_batch_sizes) == 4
    assert (result.plan.micro_batch, result.plan.grad_accum_steps) == (decision.micro_batch, decision.grad_accum_steps)
    assert result.tuner == decision.to_dict()
    assert any("timing splits" in s for s in stages)


@pytest.mark.heavy
@pytest.mark.slow
def test_grad_checkpointing_auto_probes_a_checkpointed_model(monkeypatch):
    """``auto`` probes twice; the second probe's model is checkpointed, so a larger micro-batch fits.

    The probe is wrapped, not replaced: every call runs the real probe and is only recorded.
    """
    probes = []
    real_probe = gaplan.benchmark.tuner.probe

    def recording_probe(spec, **options):
        result = real_probe(spec, **options)
        probes.append((spec, result))
        return result

    monkeypatch.setattr(gaplan.benchmark.tuner, "probe", recording_probe)
    tuned = tune(WorkloadSpec(**SMALL_SPEC, optimizer="sgd"), grad_checkpointing="auto", device="cpu",
                 memory_limit=SMALL_BUDGET, effective_batch=256, bench_settings=ONE_LOOK)
    assert [spec.grad_checkpointing for spec, _ in probes] == [OFF, ON]
    (_, off), (_, on) = probes
    assert off.workload.grad_checkpointing == OFF and on.workload.grad_checkpointing == ON
    assert not off.capped and not on.capped
    assert on.max_micro_batch > off.max_micro_batch, (off.max_micro_batch, on.max_micro_batch)
    # Checkpointing pays for itself only if its larger split wins on measured throughput: either way, said why.
    assert len(tuned.benches) == 2
    decision = tuned.decision
    assert decision.grad_checkpointing == tuned.result.workload.grad_checkpointing.spec_value()  # plan.json's form
    if decision.grad_checkpointing:
        assert decision.micro_batch > off.max_micro_batch and "with gradient checkpointing" in decision.reason
    else:
        assert "gradient checkpointing off: its larger micro-batch ran slower" in decision.reason
    assert tuned.result.plan.effective_batch == 256
