"""The batch schedule's arithmetic, exhaustively on small sizes: levels, the warmup ramp, the adaptive rule's window,
hysteresis and cap, the samples' positions, the cap that keeps two micro-batches, and its bad input."""

import re

import pytest

from gaplan.core.options import OptionError
from gaplan.plan.growth_test import MIN_STEPS, WINDOW, StepNoise
from gaplan.plan.schedule import BatchSchedule, ScheduleState, measurable_cap, parse_schedule
from gaplan.plan.split import make_plan


@pytest.mark.parametrize("minimum,maximum,levels", [(8, 32, [8, 16, 32]), (3, 20, [3, 6, 12, 20]), (5, 5, [5]),
                                                     (1, 2, [1, 2]), (4, 9, [4, 8, 9])])
def test_levels_double_from_the_minimum_and_end_at_the_maximum(minimum, maximum, levels):
    assert BatchSchedule("warmup", minimum, maximum, ramp_steps=1).levels == levels
    if minimum >= 2:  # (adaptive on one process starts at 2)
        assert BatchSchedule("adaptive", minimum, maximum).levels == levels
    assert BatchSchedule("fixed", minimum, maximum).levels == [maximum]


def test_warmup_4_from_4_to_16_ramps_over_its_first_4_steps_as_docs_adaptive_says():
    schedule = BatchSchedule("warmup", 4, 16, 4)
    assert [schedule.ramp_batch(step) for step in range(6)] == [4, 4, 8, 8, 16, 16]  # log steps 1-4, then 5 on


@pytest.mark.parametrize("minimum", range(1, 9))
@pytest.mark.parametrize("maximum", range(1, 40))
@pytest.mark.parametrize("ramp", [1, 2, 5, 13])
def test_the_warmup_ramp_starts_at_the_minimum_never_falls_and_is_the_maximum_from_its_last_step(minimum, maximum,
                                                                                                  ramp):
    if minimum > maximum:
        return
    schedule = BatchSchedule("warmup", minimum, maximum, ramp)
    batches = [schedule.ramp_batch(step) for step in range(ramp + 5)]
    assert batches[0] == minimum and batches == sorted(batches)
    assert all(b == maximum for b in batches[ramp:]) and set(batches) <= set(schedule.levels)
    state, seen = schedule.start(), []  # the same through after_step, which ignores the noise scale
    for step in range(ramp + 5):
        seen.append(state.effective_batch)
        state, _ = schedule.after_step(state, step, noise(0.0))
    assert seen == batches


def replay(schedule, readings):
    state, batches, changes = schedule.start(), [], []
    for step, reading in enumerate(readings):
        batches.append(state.effective_batch)
        state, change = schedule.after_step(state, step, reading)
        if change:
            changes.append(change)
    return batches, changes, state


def noise(scale, jitter=0.0):
    """A step whose estimates give the noise scale ``scale`` (|G|^2 = 1 per sample), tr(S) moved by ``jitter``."""
    return StepNoise(scale + jitter, 1.0)


def steady(scale, count):
    return [noise(scale, (-1) ** i) for i in range(count)]  # a spread of 1 around ``scale``: a clear mean


def test_adaptive_grows_on_the_steps_measured_at_the_batch_and_starts_a_new_window_after_a_change():
    schedule = BatchSchedule("adaptive", 4, 32)
    # 20 >= 2 x 4, clearly: the first decision is at MIN_STEPS steps; then 20 against 2 x 8 = 16, clearly again
    batches, changes, state = replay(schedule, steady(20.0, 30))
    assert batches == [4] * MIN_STEPS + [8] * MIN_STEPS + [16] * 10
    assert [(c.step, c.before, c.after) for c in changes] == [(MIN_STEPS, 4, 8), (2 * MIN_STEPS, 8, 16)]
    assert changes[0].reason.startswith(f"noise scale 20.0 over the {MIN_STEPS} steps at 4: ")
    assert changes[0].reason.endswith(" standard errors above 2 x 4, 4.47 needed")
    assert state.streak == 10, "20 < 2 x 16: the window at 16 keeps its steps and the batch stays"


def test_steps_not_measured_do_not_count_and_a_window_at_or_below_zero_gradient_is_not_growth():
    schedule = BatchSchedule("adaptive", 4, 32)
    batches, _, state = replay(schedule, [None, *steady(20.0, MIN_STEPS - 1), None, None])
    assert batches == [4] * (MIN_STEPS + 2) and state.streak == MIN_STEPS - 1
    # tr(S) far above 2E |G|^2 but |G|^2 averaging below zero: the noise scale is not measured, not infinite
    lost = [StepNoise(50.0 + (-1) ** i, -0.5) for i in range(40)]
    batches, _, _ = replay(schedule, lost)
    assert batches == [4] * 40


def test_adaptive_never_shrinks_never_passes_the_maximum_and_keeps_no_window_there():
    schedule = BatchSchedule("adaptive", 2, 12)
    batches, _, state = replay(schedule, steady(1e9, 40) + steady(0.0, 30))
    assert batches[::MIN_STEPS] == [2, 4, 8, 12, 12, 12, 12] and set(batches[40:]) == {12}
    assert state.effective_batch == 12 and state.window == ()


def test_the_window_keeps_its_last_steps_and_a_checkpoint_keeps_it():
    schedule = BatchSchedule("adaptive", 4, 32)
    _, _, state = replay(schedule, steady(5.0, WINDOW + 7))  # 5 < 2 x 4: no growth, the window fills
    assert state.streak == WINDOW and state.window[-1] == noise(5.0, (-1) ** (WINDOW + 6))
    assert ScheduleState.from_dict(state.to_dict()) == state
    older = {"effective_batch": 8, "streak": 3, "first_sample": 40}  # a checkpoint of an older gaplan
    assert ScheduleState.from_dict(older) == ScheduleState(8, 40)


@pytest.mark.parametrize("maximum", [1, 2, 16])
def test_adaptive_on_one_process_starts_where_a_step_has_two_micro_batches(maximum):
    with pytest.raises(OptionError) as raised:
        BatchSchedule("adaptive", 1, maximum)
    if maximum == 1:
        assert "use warmup:STEPS" in str(raised.value) and raised.value.fields == ("batch_schedule", "effective_batch")
    else:
        assert "effective_batch_min must be 2 or more" in str(raised.value)
    assert BatchSchedule("adaptive", 2, 2, world_size=2).levels == [2]


@pytest.mark.parametrize("kind", ["fixed", "adaptive", "warmup"])
def test_each_step_starts_where_the_last_one_ended(kind):
    schedule = BatchSchedule(kind, 2, 16, ramp_steps=4)
    batches, _, state = replay(schedule, steady(100.0, 30))
    assert state.first_sample == sum(batches)
    assert ScheduleState.from_dict(state.to_dict()) == state


@pytest.mark.parametrize("effective", range(1, 40))
@pytest.mark.parametrize("cap", range(1, 20))
@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_measurable_cap_gives_two_micro_batches_in_all_and_never_a_larger_one(effective, cap, world):
    if effective % world:
        return
    bounded = measurable_cap(effective, cap, world)
    plan = make_plan(effective, bounded, world)
    assert 1 <= bounded <= cap and plan.micro_batch <= cap
    if effective >= 2:
        assert plan.grad_accum_steps * world >= 2
    assert plan.grad_accum_steps <= max(make_plan(effective, cap, world).grad_accum_steps, 2)


@pytest.mark.parametrize("text,error", [
    ("sometimes", "batch_schedule must be fixed, adaptive or warmup:STEPS (got 'sometimes')"),
    ("adaptive:3", "batch_schedule must be fixed, adaptive or warmup:STEPS"),
    ("warmup", "warmup:STEPS needs a positive number of steps"),
    ("warmup:0", "warmup:STEPS needs a positive number of steps"),
    ("warmup:x", "warmup:STEPS needs a positive number of steps"),
])
def test_a_bad_schedule_is_one_line_naming_it(text, error):
    with pytest.raises(OptionError, match=re.escape(error)) as raised:
        parse_schedule(text)
    assert raised.value.fields == ("batch_schedule",)


def test_bad_bounds_name_the_arguments():
    with pytest.raises(OptionError, match="effective_batch_min 64 is above effective_batch 32") as raised:
        BatchSchedule("adaptive", 64, 32)
    assert raised.value.fields == ("effective_batch_min", "effective_batch")
    with pytest.raises(OptionError, match="effective_batch_min 3 is not divisible by the world size 2"):
        BatchSchedule("adaptive", 3, 32, world_size=2)
    with pytest.raises(OptionError, match="threshold must be a positive number"):
        BatchSchedule("adaptive", 2, 32, threshold=float("nan"))
    assert parse_schedule("warmup:12") == ("warmup", 12) and parse_schedule("adaptive") == ("adaptive", 0)
