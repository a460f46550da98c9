"""The batch schedule's arithmetic, exhaustively on small sizes: levels, the warmup ramp, the adaptive rule's streak,
hysteresis and cap, the samples' positions, the cap that keeps two micro-batches, and its bad input."""

import math
import re

import pytest

from gaplan.core.options import OptionError
from gaplan.plan.schedule import BatchSchedule, ScheduleState, measurable_cap, parse_schedule
from gaplan.plan.split import make_plan


@pytest.mark.parametrize("minimum,maximum,levels", [(8, 32, [8, 16, 32]), (3, 20, [3, 6, 12, 20]), (5, 5, [5]),
                                                     (1, 2, [1, 2]), (4, 9, [4, 8, 9])])
def test_levels_double_from_the_minimum_and_end_at_the_maximum(minimum, maximum, levels):
    assert BatchSchedule("adaptive", minimum, maximum).levels == levels
    assert BatchSchedule("fixed", minimum, maximum).levels == [maximum]


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
        state, _ = schedule.after_step(state, step, noise_scale=0.0)
    assert seen == batches


def replay(schedule, readings):
    state, batches, changes = schedule.start(), [], []
    for step, reading in enumerate(readings):
        batches.append(state.effective_batch)
        state, change = schedule.after_step(state, step, reading)
        if change:
            changes.append(change)
    return batches, changes, state


def test_adaptive_grows_after_patience_steps_in_a_row_and_the_streak_restarts():
    schedule = BatchSchedule("adaptive", 4, 32, patience=3)
    batches, changes, _ = replay(schedule, [8.0, 8.0, 8.0, 100, 100, 100, 100])
    # 8 >= 2 x 4 three times: 8 from step 4; 100 >= 16 three times more: 16 from step 7
    assert batches == [4, 4, 4, 8, 8, 8, 16]
    assert [(c.step, c.before, c.after) for c in changes] == [(3, 4, 8), (6, 8, 16)]
    assert changes[0].reason == "noise scale 8.0 >= 2 x 4 for 3 steps"
    batches, _, _ = replay(schedule, [8.0, 8.0, 7.9, 8.0, 8.0, None, 8.0, 8.0, 8.0])
    assert batches == [4] * 9, "a reading below 2E or none breaks the streak"


def test_adaptive_never_shrinks_and_never_passes_the_maximum():
    schedule = BatchSchedule("adaptive", 2, 12, patience=1)
    batches, _, state = replay(schedule, [1e9] * 6 + [0.0] * 6 + [math.inf] * 3)
    assert batches == [2, 4, 8, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12]
    assert state.effective_batch == 12


@pytest.mark.parametrize("kind", ["fixed", "adaptive", "warmup"])
def test_each_step_starts_where_the_last_one_ended(kind):
    schedule = BatchSchedule(kind, 2, 16, ramp_steps=4, patience=1)
    batches, _, state = replay(schedule, [100.0] * 10)
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
