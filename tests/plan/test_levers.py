"""The lever rows, the cost model and the pick (gaplan.plan.levers, lever_cost, lever_pick): pure arithmetic."""

import itertools
import json
import math

import pytest

from gaplan.core.checkpointing import ON
from gaplan.core.errors import GaplanError
from gaplan.core.loss_choice import LossChoice
from gaplan.plan.lever_cost import OPTIMIZER_PASSES, RATES, CostInputs, step_cost
from gaplan.plan.lever_pick import LeverComparison, LeverResult, compare_measured, pick, rank
from gaplan.plan.levers import (
    BY_NAME,
    DEFAULT_LEVERS,
    LEVERS,
    OPTIMIZER_LEVERS,
    Base,
    cuda_only,
    lever_rows,
    not_compared,
    parse_levers,
    row_label,
    row_recompute,
    row_settings,
    row_tradeoffs,
)
from gaplan.workload.spec import OPTIMIZERS, WorkloadSpec


def test_every_optimizer_is_a_lever_and_every_lever_sets_a_real_field():
    assert set(OPTIMIZER_LEVERS) == set(OPTIMIZERS) == set(OPTIMIZER_PASSES)
    fields = set(WorkloadSpec.__dataclass_fields__)
    for lever in LEVERS:
        assert lever.field in fields, lever.name
        WorkloadSpec(model="tiny-gpt2", **{lever.field: lever.value}).validate()  # a value the spec accepts


def test_default_levers_keep_the_optimizer():
    assert parse_levers(None) == parse_levers("") == DEFAULT_LEVERS == ("chunked", "ckpt", "ops", "every:2", "offload")
    assert not set(DEFAULT_LEVERS) & set(OPTIMIZER_LEVERS)  # and compile only when named: a minute a row


def test_parse_levers_orders_dedupes_and_expands_groups():
    assert parse_levers("ckpt, lion,chunked,lion") == ("lion", "chunked", "ckpt")
    assert parse_levers("optimizers") == OPTIMIZER_LEVERS
    assert parse_levers("all") == tuple(BY_NAME)
    assert parse_levers(["sgd", "ckpt"]) == ("sgd", "ckpt")
    assert parse_levers("none") == ()


@pytest.mark.parametrize("text", ["adam", "ckpt,every:0", "chunked,,bogus", "none,ckpt"])
def test_unknown_lever_is_one_line_naming_the_flag(text):
    with pytest.raises(GaplanError, match=r"^--levers: unknown lever '.+'; choose from adamw, .*compile") as caught:
        parse_levers(text)
    assert "\n" not in str(caught.value)


def test_default_rows_are_base_each_alone_and_together():
    assert lever_rows(DEFAULT_LEVERS) == [(), ("chunked",), ("ckpt",), ("ops",), ("every:2",), ("offload",),
                                          ("chunked", "ckpt", "offload")]


def test_a_cpu_table_leaves_out_offloading_and_says_why():
    assert lever_rows(DEFAULT_LEVERS, device_kind="cpu") == [(), ("chunked",), ("ckpt",), ("ops",), ("every:2",),
                                                             ("chunked", "ckpt")]
    assert ("offload", BY_NAME["offload"].gpu_only) in not_compared(DEFAULT_LEVERS, device_kind="cpu")
    assert "offload" not in dict(not_compared(DEFAULT_LEVERS))
    assert lever_rows(("offload", "ckpt"), Base(offload_activations=True)) == [(), ("ckpt",)]


def test_compile_is_a_row_alone_and_together_when_named():
    chosen = parse_levers("chunked,ckpt,compile")
    for device_kind in ("cpu", "cuda"):
        assert lever_rows(chosen, device_kind=device_kind) == [(), ("chunked",), ("ckpt",), ("compile",),
                                                               ("chunked", "ckpt")]  # compile alone: it compiles
    assert row_settings(("compile",)) == {"compile": True} and row_recompute(("compile",)) == (0.0, 0.0)
    assert lever_rows(chosen, Base(compile=True), "cpu") == [(), ("chunked",), ("ckpt",), ("chunked", "ckpt")]
    assert not_compared(chosen, Base(compile=True)) == [("compile", "the workload already has it (the base row)")]


def test_all_levers_are_twenty_two_rows_with_adamw():
    rows = lever_rows(parse_levers("all"))
    assert len(rows) == 22 and sum(len(row) == 1 for row in rows) == 13 and ("chunked", "ckpt", "offload") in rows
    assert sum(len(row) == 4 for row in rows) == 7 and sum("compile" in row for row in rows) == 1


def test_rows_with_optimizers_add_each_alone_and_with_the_memory_levers():
    rows = lever_rows(parse_levers("lion,adafactor,chunked,ckpt"))
    assert rows == [(), ("adafactor",), ("lion",), ("chunked",), ("ckpt",), ("chunked", "ckpt"),
                    ("adafactor", "chunked", "ckpt"), ("lion", "chunked", "ckpt")]


def test_rows_are_fewer_than_the_cartesian_product_and_never_repeat():
    for count in range(len(LEVERS) + 1):
        for chosen in itertools.combinations(BY_NAME, count):
            rows = lever_rows(chosen)
            assert len(rows) == len(set(rows)) and rows[0] == ()
            assert all(len({BY_NAME[n].kind for n in row}) == len(row) for row in rows), "one lever of each kind"
            assert len(rows) <= 2 * len(chosen) + 2


def test_a_lever_the_base_has_is_not_a_row_and_says_why():
    base = Base(optimizer="lion", loss=LossChoice(64))
    assert lever_rows(parse_levers("lion,sgd,chunked,ckpt"), base) == [(), ("sgd",), ("ckpt",), ("sgd", "ckpt")]
    assert not_compared(parse_levers("lion,chunked,compile"), base) == [
        ("lion", "the workload already has it (the base row)"),
        ("chunked", "the workload already has it (the base row)")]
    assert lever_rows(("ckpt",), Base(grad_checkpointing=ON)) == [()]


def test_row_settings_label_tradeoffs_and_cuda_only():
    assert row_settings(("lion", "chunked", "ckpt")) == {"optimizer": "lion", "loss": "chunked",
                                                         "grad_checkpointing": ON}
    assert row_label(()) == "base" and row_label(("chunked", "ckpt")) == "chunked+ckpt"
    swap = row_tradeoffs(("adafactor",), Base(optimizer="adamw"))[0]
    assert swap.startswith("changes the optimizer: the loss curve is not the adamw one")
    assert cuda_only(("paged-adamw-8bit", "ckpt")) and not cuda_only(("adamw-8bit", "chunked"))
    assert row_settings(("offload",)) == {"offload_activations": True}


INPUTS = CostInputs(param_count=1_000_000, trainable_count=1_000_000, head_params=250_000, tokens_per_sample=128,
                    weight_bytes=4, device_kind="cpu")


def test_step_cost_by_hand():
    cost = step_cost(INPUTS, effective_batch=16, grad_accum_steps=4, optimizer="adamw")
    rates = RATES["cpu"]
    assert math.isclose(cost.compute_s, 16 * 2 * 1e6 * 128 * 3 / rates.flops_per_s)  # forward + 2 backward
    assert math.isclose(cost.micro_steps_s, 4 * (2e6 + 2e6) * 4 / rates.bytes_per_s)
    assert math.isclose(cost.optimizer_s, 1e6 * 7 * 4 / rates.bytes_per_s)
    assert math.isclose(cost.total_s, cost.compute_s + cost.micro_steps_s + cost.optimizer_s)


def test_recompute_is_one_more_forward_of_what_is_recomputed():
    plain = step_cost(INPUTS, effective_batch=8, grad_accum_steps=1, optimizer="sgd")
    blocks = step_cost(INPUTS, effective_batch=8, grad_accum_steps=1, optimizer="sgd", recompute_blocks=1.0)
    head = step_cost(INPUTS, effective_batch=8, grad_accum_steps=1, optimizer="sgd", recompute_head=1.0)
    both = step_cost(INPUTS, effective_batch=8, grad_accum_steps=1, optimizer="sgd", recompute_blocks=1.0,
                     recompute_head=1.0)
    assert math.isclose(blocks.compute_s / plain.compute_s, (3 + 0.75) / 3)  # the blocks are 3/4 of the forward
    assert math.isclose(head.compute_s / plain.compute_s, (3 + 0.25) / 3)
    assert math.isclose(both.compute_s / plain.compute_s, 4 / 3)  # a whole forward again: a third more


def test_lora_backward_skips_the_frozen_weights_gradients():
    lora = CostInputs(1_000_000, 10_000, 0, 128, 2, "cuda")
    cost = step_cost(lora, effective_batch=4, grad_accum_steps=2, optimizer="adamw")
    assert math.isclose(cost.compute_s, 4 * 2 * 1e6 * 128 * (2 + 0.01) / RATES["cuda"].flops_per_s)
    assert math.isclose(cost.optimizer_s, 1e4 * 7 * 2 / RATES["cuda"].bytes_per_s)


def test_offloading_sends_what_is_saved_to_the_host_and_back():
    gpu = CostInputs(1_000_000, 1_000_000, 0, 128, 2, "cuda")
    plain = step_cost(gpu, effective_batch=8, grad_accum_steps=2, optimizer="adamw")
    offloaded = step_cost(gpu, effective_batch=8, grad_accum_steps=2, optimizer="adamw", host_bytes=3e9)
    assert plain.host_s == 0 and math.isclose(offloaded.host_s, 2 * 3e9 / 64e9)  # PCIe Gen5 x16, one way
    assert math.isclose(offloaded.total_s - plain.total_s, offloaded.host_s)
    with pytest.raises(ValueError, match="its host is its memory"):
        step_cost(INPUTS, effective_batch=8, grad_accum_steps=1, optimizer="adamw", host_bytes=1.0)


def test_more_micro_steps_and_heavier_optimizers_cost_more():
    times = [step_cost(INPUTS, effective_batch=64, grad_accum_steps=s, optimizer="adamw").total_s for s in (1, 2, 8)]
    assert times == sorted(times) and times[0] < times[-1]
    by_optimizer = {o: step_cost(INPUTS, effective_batch=64, grad_accum_steps=1, optimizer=o).optimizer_s
                    for o in OPTIMIZERS}
    assert by_optimizer["sgd"] < by_optimizer["adamw-8bit"] < by_optimizer["lion"] < by_optimizer["adamw"]
    with pytest.raises(ValueError):
        step_cost(INPUTS, effective_batch=64, grad_accum_steps=0, optimizer="adamw")


def _row(levers, fits=True, model=None, rate=None, low=None, high=None):
    return LeverResult(tuple(levers), fits, max_micro_batch=4 if fits else None, grad_accum_steps=2 if fits else None,
                       model_seconds=model, samples_per_s=rate, samples_per_s_low=low, samples_per_s_high=high)


def test_pick_by_model_time_then_fewer_levers_then_order():
    rows = [_row((), model=2.0), _row(("ckpt",), model=1.5), _row(("chunked",), model=1.5),
            _row(("chunked", "ckpt"), model=1.5), _row(("lion",), fits=False)]
    assert pick(rows).levers == ("ckpt",)
    assert [r.label for r in rank(rows)] == ["ckpt", "chunked", "chunked+ckpt", "base", "lion"]
    assert pick([_row((), fits=False), _row(("ckpt",), fits=None)]) is None


def test_modelled_times_within_two_percent_are_a_tie_won_by_fewer_levers():
    rows = [_row((), model=1.0), _row(("lion",), model=0.985), _row(("lion", "ckpt"), model=0.5)]
    assert pick(rows).levers == ("lion", "ckpt")  # far faster: taken
    rows = [_row((), model=1.0), _row(("lion",), model=0.985), _row(("chunked", "ckpt"), model=0.981)]
    assert pick(rows).levers == ()  # within 2% of the least: the base, the smallest change
    assert rank(rows)[0].levers == ("chunked", "ckpt")  # the ranking itself stays by time
    assert pick([_row((), model=1.0), _row(("lion",), model=0.97)]).levers == ("lion",)


def test_a_measured_row_beats_any_modelled_one_and_the_fastest_measured_wins():
    rows = [_row((), model=0.1), _row(("ckpt",), model=9.0, rate=10.0), _row(("chunked",), model=9.0, rate=12.0)]
    assert pick(rows).levers == ("chunked",)


# Synthetic measurements: (point, low, high) per row. The measured pick is at least as fast as each other measured
# row that reaches E, within the bench's own interval: no other row's interval lies wholly above the pick's.
MEASUREMENTS = [
    [(10.0, 9.0, 11.0), (12.0, 11.5, 12.5), (11.8, 10.0, 13.0), (5.0, 4.0, 6.0)],
    [(10.0, None, None), (10.0, None, None), (9.99, None, None)],  # one round each: no interval
    [(3.0, 1.0, 9.0), (2.9, 2.8, 3.0), (1.0, 0.9, 1.1)],
    [(7.0, 6.9, 7.1)],
]


@pytest.mark.parametrize("measured", MEASUREMENTS)
def test_the_measured_pick_is_at_least_as_fast_as_each_other_within_the_interval(measured):
    rows = [_row(("x",) * i, rate=point, low=low, high=high) for i, (point, low, high) in enumerate(measured)]
    rows.append(_row(("never",), fits=False, rate=100.0))  # a row that did not reach E does not count
    chosen = pick(rows)
    assert chosen.samples_per_s == max(p for p, _, _ in measured)
    for other in rows[:-1]:
        if other is not chosen:
            assert compare_measured(chosen, other) in ("slower", "within the interval")


def test_compare_measured_by_hand():
    chosen = _row((), rate=12.0, low=11.5, high=12.5)
    assert compare_measured(chosen, _row(("a",), rate=11.8, low=10.0, high=13.0)) == "within the interval"
    assert compare_measured(chosen, _row(("a",), rate=5.0, low=4.0, high=6.0)) == "slower"
    assert compare_measured(chosen, _row(("a",), rate=20.0, low=19.0, high=21.0)) == "faster"
    assert compare_measured(_row((), rate=10.0), _row(("a",), rate=10.0)) == "within the interval"
    with pytest.raises(ValueError):
        compare_measured(chosen, _row(("a",), model=1.0))


def test_comparison_relative_time_within_interval_and_dict():
    rows = [_row((), model=2.0, rate=10.0, low=9.0, high=11.0), _row(("ckpt",), model=3.0, rate=10.5, low=10.2,
                                                                           high=10.8),
            _row(("chunked",), model=2.5, rate=4.0, low=3.9, high=4.1)]
    comparison = LeverComparison("tiny-gpt2", "cpu", None, 2**30, 2**30, 16, Base(), rows,
                                 not_compared=[("compile", "why")])
    assert comparison.pick.levers == ("ckpt",)
    assert comparison.relative_time(rows[1]) == 1.5
    assert [r.label for r in comparison.within_interval()] == ["base"]
    data = comparison.to_dict()
    assert data["pick"]["label"] == "ckpt" and data["within_interval"] == ["base"]
    assert data["results"][1]["tradeoffs"] == [BY_NAME["ckpt"].tradeoff]
    assert data["not_compared"] == [{"lever": "compile", "why": "why"}] and data["base"]["optimizer"] == "adamw"
    assert data["base"]["loss"] == "plain"  # the text --loss takes (levers.json, plan --json)
    chunked = LeverComparison("tiny-gpt2", "cpu", None, 2**30, 2**30, 16, Base(loss=LossChoice(64)), rows)
    assert chunked.to_dict()["base"]["loss"] == "chunked:64" and json.dumps(chunked.to_dict())


def test_row_recompute_from_the_levers_or_the_base():
    assert row_recompute(()) == (0.0, 0.0)
    assert row_recompute(("lion", "chunked", "ckpt")) == (1.0, 1.0)
    assert row_recompute(("ckpt",), Base(loss=LossChoice(64))) == (1.0, 1.0)
    assert row_recompute(("sgd",), Base(grad_checkpointing=ON)) == (1.0, 0.0)
