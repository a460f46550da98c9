"""gaplan plan's lever table on one device (gaplan.workflows.plan_levers): the option check, and the documented table."""

import pytest

from gaplan.core.errors import GaplanError
from gaplan.plan.levers import DEFAULT_LEVERS
from gaplan.workflows.plan_levers import lever_selection


def test_lever_selection_is_for_one_device():
    assert lever_selection(None, 1) == DEFAULT_LEVERS
    assert lever_selection("ckpt,lion", 1) == ("lion", "ckpt")
    assert lever_selection("none", 1) == () and lever_selection("none", 4) == ()
    assert lever_selection(None, 2) == ()  # over ranks, no lever table unless asked (then refused)
    with pytest.raises(GaplanError, match="^--levers compares the levers on one device: it goes with --world-size 1"):
        lever_selection("ckpt", 2)
    with pytest.raises(GaplanError, match="^--levers: unknown lever 'adam'"):
        lever_selection("adam", 1)


@pytest.mark.slow
@pytest.mark.heavy
def test_the_documented_lever_table():
    """docs/levers.md's example: tiny-gpt2 on the CPU at 300 MiB, E = 64, fp32, one thread."""
    from gaplan.workflows.plan_levers import compare_levers, cost_inputs
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-gpt2", dtype="fp32")
    table = compare_levers(spec, effective_batch=64, levers="chunked,ckpt,adafactor,lion", memory_limit=300 * 2**20,
                           device_kind="cpu", threads=1)
    found = {r.label: (r.max_micro_batch, r.grad_accum_steps, round(table.relative_time(r), 2)) for r in table.results}
    assert found == {"base": (8, 8, 1.0), "adafactor": (9, 8, 1.0), "lion": (8, 8, 1.0), "chunked": (11, 6, 1.11),
                     "ckpt": (16, 4, 1.18), "chunked+ckpt": (41, 2, 1.29), "adafactor+chunked+ckpt": (49, 2, 1.29),
                     "lion+chunked+ckpt": (45, 2, 1.29)}
    assert table.pick.label == "base"  # lion is under 2% faster by the model: a tie, and the base has fewer levers
    assert table.not_compared == []  # compile was not asked for
    inputs = cost_inputs(spec, "cpu")
    assert inputs.head_params == 8192 * 256 and inputs.param_count == 5_518_848 and inputs.tokens_per_sample == 128
    assert "--loss chunked" in next(r for r in table.results if r.label == "chunked").command


def test_measure_leaves_a_cuda_only_row_with_its_estimate_on_the_cpu():
    """paged-adamw-8bit is estimated on the CPU, never probed or timed there; a row that does not fit is not run."""
    from gaplan.plan.lever_pick import LeverComparison, LeverResult
    from gaplan.plan.levers import Base
    from gaplan.workflows.plan_levers import measure_levers

    paged = LeverResult(("paged-adamw-8bit",), True, 4, 4, 1, 2**20, model_seconds=1.0,
                        note="estimate only: ...", extra={"cuda_only": True})
    too_big = LeverResult((), False, note="does not fit")
    comparison = LeverComparison("tiny-gpt2", "cpu", None, 2**30, 2**30, 4, Base(), [too_big, paged],
                                 workload={"model": "tiny-gpt2"})
    seen = []
    measured = measure_levers(comparison, device="cpu", on_result=seen.append)
    assert measured.results == [too_big, paged] and measured.measured_on == "cpu" and seen == []
    assert measured.pick is paged and paged.samples_per_s is None


def test_the_offload_row_holds_less_and_pays_its_host_copies_on_a_gpu():
    """On a GPU target the offload row's peak is below the base's and its modelled time is the base's plus the traced
    copies over PCIe; a CPU's table leaves it out, saying why."""
    from gaplan.plan.lever_cost import RATES, step_cost
    from gaplan.plan.levers import BY_NAME
    from gaplan.workflows.plan_levers import compare_levers, cost_inputs
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=64, dtype="bf16")
    table = compare_levers(spec, effective_batch=16, levers="offload", target="h100-80gb", device_kind="cuda")
    base, offload = table.results
    assert offload.label == "offload" and offload.peak_bytes < base.peak_bytes
    host = 16 * offload.extra["host_bytes_per_sample"] + offload.grad_accum_steps * offload.extra[
        "host_bytes_per_micro_step"]
    plain = step_cost(cost_inputs(spec, "cuda"), effective_batch=16, grad_accum_steps=offload.grad_accum_steps,
                      optimizer="adamw").total_s
    assert offload.model_seconds == pytest.approx(plain + 2 * host / RATES["cuda"].host_bytes_per_s)
    # A workload that offloads already: its base row is traced here, copies and all (the layouts' row has none).
    offloading = compare_levers(WorkloadSpec(model="tiny-gpt2", seq_len=64, dtype="bf16", offload_activations=True),
                                effective_batch=16, levers="ckpt", target="h100-80gb", device_kind="cuda",
                                known_base=base)
    assert offloading.results[0].model_seconds == pytest.approx(offload.model_seconds)
    on_cpu = compare_levers(WorkloadSpec(model="tiny-gpt2", seq_len=32), effective_batch=4, levers="offload",
                            device_kind="cpu", threads=1)
    assert [r.label for r in on_cpu.results] == ["base"]
    assert on_cpu.not_compared == [("offload", BY_NAME["offload"].gpu_only)]


@pytest.mark.slow
@pytest.mark.heavy  # the compile row's trace compiles the model: about 40 s a device on 2 cores
@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_the_compile_row_keeps_less_at_the_eager_modelled_time(device_kind):
    """The compiled step saves less for backward (inductor's partitioner), its split is the base's at this batch, so
    its modelled time is the base's (compile's speed is not modelled), and its note says so."""
    from gaplan.workflows.plan_levers import compare_levers
    from gaplan.workload.spec import WorkloadSpec

    target = "h100-80gb" if device_kind == "cuda" else None
    table = compare_levers(WorkloadSpec(model="tiny-gpt2", seq_len=64, dtype="fp32", optimizer="sgd"),
                           effective_batch=8, levers="compile", device_kind=device_kind, target=target, threads=1)
    base, compiled = table.results
    assert compiled.label == "compile" and compiled.fits and compiled.peak_bytes < base.peak_bytes
    assert (compiled.micro_batch, compiled.grad_accum_steps) == (base.micro_batch, base.grad_accum_steps)
    assert compiled.model_seconds == pytest.approx(base.model_seconds)
    assert compiled.note == "time (model): the eager kernels'" and "--compile" in compiled.command
    assert table.not_compared == []
