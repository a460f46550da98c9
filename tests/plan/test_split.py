"""Plan arithmetic, exhaustively and with hypothesis."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gaplan import GaplanError, Plan, make_plan
from gaplan.plan.split import make_even_plan, split_evenly


def test_issue_example_256_over_48():
    plan = make_plan(256, 48)
    assert plan.grad_accum_steps == 6
    assert plan.micro_batch_sizes == (43, 43, 43, 43, 42, 42)
    assert plan.micro_batch == 43


def test_exact_divisor_gives_equal_sizes():
    plan = make_plan(256, 64)
    assert plan.grad_accum_steps == 4 and plan.is_even and plan.micro_batch_sizes == (64,) * 4


def test_fits_without_accumulation():
    plan = make_plan(32, 100)
    assert plan.grad_accum_steps == 1 and plan.micro_batch_sizes == (32,)


@given(st.integers(1, 5000), st.integers(1, 600), st.integers(1, 16))
def test_plan_properties(effective, max_micro, world):
    if effective < world or effective % world:
        with pytest.raises(GaplanError):
            make_plan(effective, max_micro, world)
        return
    plan = make_plan(effective, max_micro, world)
    flat = [s for sizes in plan.rank_micro_batch_sizes for s in sizes]
    assert sum(flat) == effective
    assert max(flat) - min(flat) <= 1
    assert max(flat) <= max_micro and min(flat) >= 1
    assert all(len(sizes) == plan.grad_accum_steps for sizes in plan.rank_micro_batch_sizes)
    assert len(plan.rank_micro_batch_sizes) == world
    # minimal: one step fewer would need a micro-batch larger than max_micro
    if plan.grad_accum_steps > 1:
        fewer = plan.grad_accum_steps - 1
        assert -(-effective // (world * fewer)) > max_micro
    assert Plan.from_dict(plan.to_dict()) == plan


@given(st.integers(0, 10000), st.integers(1, 100))
def test_split_evenly(total, parts):
    sizes = split_evenly(total, parts)
    assert sum(sizes) == total and len(sizes) == parts and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("args, message", [
    ((0, 8), "effective batch must be a positive integer (got 0)"),
    ((8, 0), "nothing fits"),
    ((2, 8, 4), "smaller than the world size"),
    ((8, 8, 0), "world size must be a positive integer"),
    ((10, 8, 4), "not divisible by the world size 4"),
])
def test_bad_input(args, message):
    with pytest.raises(GaplanError, match=re.escape(message)):
        make_plan(*args)


def test_from_dict_rejects_garbage():
    with pytest.raises(GaplanError):
        Plan.from_dict({"effective_batch": 8})
    data = make_plan(256, 48).to_dict()
    data["grad_accum_steps"] = 3
    with pytest.raises(GaplanError, match="inconsistent"):
        Plan.from_dict(data)


def test_even_plan_of_the_issue_example_is_32_by_8():
    plan = make_even_plan(256, 48)
    assert (plan.micro_batch, plan.grad_accum_steps, plan.micro_batch_cap) == (32, 8, 48) and plan.is_even


def test_even_plan_exhaustively_is_the_fewest_steps_of_one_size():
    for effective in range(1, 97):
        for world in (1, 2, 3, 4):
            if effective % world:
                continue
            share = effective // world
            for cap in range(1, share + 3):
                plan = make_even_plan(effective, cap, world)
                assert plan.is_even and plan.micro_batch * plan.grad_accum_steps * world == effective
                assert plan.micro_batch <= cap
                fewer = [g for g in range(1, plan.grad_accum_steps) if share % g == 0 and share // g <= cap]
                assert not fewer, (effective, cap, world, plan)
                assert plan.grad_accum_steps >= make_plan(effective, cap, world).grad_accum_steps


def test_even_plan_refuses_what_make_plan_refuses():
    with pytest.raises(GaplanError, match="not divisible by the world size"):
        make_even_plan(10, 4, 3)


@pytest.mark.parametrize("args, message", [
    (("10", 4), "effective batch must be a positive integer (got '10')"),
    ((True, 4), "effective batch must be a positive integer (got True)"),
    ((10, 4.5), "the largest micro-batch must be a positive integer (got 4.5)"),
    ((10, None), "the largest micro-batch must be a positive integer (got None)"),
    ((8, 4, 0), "world size must be a positive integer (got 0)"),
])
def test_a_value_of_the_wrong_type_is_named_as_given(args, message):
    """A Python caller's "10", 4.5 or True is said as such, not as "nothing fits" or a ZeroDivisionError."""
    with pytest.raises(GaplanError, match=re.escape(message)):
        make_plan(*args)
