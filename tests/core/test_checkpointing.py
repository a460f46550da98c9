"""The checkpointing value: one parser for every form a caller or a saved file holds, and the blocks it picks."""

from __future__ import annotations

import pytest

from gaplan.core.checkpointing import AUTO, OFF, ON, Checkpointing, parse_checkpointing
from gaplan.core.options import OptionError


@pytest.mark.parametrize("given, text, stored", [
    (None, "off", False), (False, "off", False), ("off", "off", False), (True, "on", True), ("on", "on", True),
    ("every:1", "on", True), ("every:2", "every:2", "every:2"), (" Layers:3 ", "layers:3", "layers:3"),
    (Checkpointing("every", 4), "every:4", "every:4"), ("ops", "ops", "ops"), (" OPS", "ops", "ops"),
])
def test_every_form_parses_to_one_value_and_off_on_stay_bools(given, text, stored):
    value = parse_checkpointing(given)
    assert str(value) == text and value.spec_value() == stored
    assert parse_checkpointing(value.spec_value()) == value  # what a plan file saved reads back the same


@pytest.mark.parametrize("bad", ["every:0", "every:x", "every:", "layers:-1", "layers:0", "sometimes", "on:2", 2, 1.5])
def test_a_bad_value_is_one_line_naming_the_option_and_the_choices(bad):
    with pytest.raises(OptionError) as caught:
        parse_checkpointing(bad)
    assert caught.value.fields == ("grad_checkpointing",) and "\n" not in str(caught.value)
    assert caught.value.for_cli().startswith("--grad-checkpointing") and "every:K" in str(caught.value)


def test_the_blocks_chosen():
    assert Checkpointing("every", 2).blocks(5) == [True, False, True, False, True]
    assert Checkpointing("layers", 2).blocks(4) == [True, True, False, False]
    assert ON.blocks(3) == [True] * 3 and OFF.blocks(3) == [False] * 3
    assert Checkpointing("every", 3).checkpointed(8) == 3 and Checkpointing("every", 4).blocks(4) == [True] + [False] * 3


@pytest.mark.parametrize("value", [Checkpointing("every", 5), Checkpointing("layers", 5)])
def test_more_blocks_than_the_model_has_is_one_line_with_the_fix(value):
    with pytest.raises(OptionError) as caught:
        value.blocks(4)
    assert f"{value.kind}:4 at most" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("options", ["gaplan.workflows.probe.ProbeOptions", "gaplan.workflows.train_options.TrainOptions",
                                     "gaplan.workload.spec.WorkloadSpec"])
def test_the_python_apis_options_hold_the_typed_value_and_refuse_text(options):
    """Text is parsed at the edge (the command line's types, parse_checkpointing); past it the field is typed."""
    import importlib

    module, name = options.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    every_2 = parse_checkpointing("every:2")
    assert cls(grad_checkpointing=every_2).grad_checkpointing == every_2
    for text in ("every:2", True, "every:0"):
        with pytest.raises(OptionError, match="grad_checkpointing must be a Checkpointing"):
            cls(grad_checkpointing=text)


def test_auto_is_a_choice_of_the_probe_and_of_a_run_from_its_plan():
    from gaplan.workflows.probe_settings import ProbeOptions
    from gaplan.workflows.train_options import TrainOptions

    assert ProbeOptions(grad_checkpointing=AUTO).grad_checkpointing == AUTO
    assert TrainOptions(grad_checkpointing=AUTO, plan_file="plan.json").grad_checkpointing == AUTO
    with pytest.raises(OptionError, match="decided by gaplan probe; give its plan_file") as caught:
        TrainOptions(grad_checkpointing=AUTO)
    assert caught.value.fields == ("grad_checkpointing", "plan_file")
