"""Options dataclasses: built from flat parsed options by their fields, nested, and errors said in field names."""

import json
from dataclasses import dataclass

import pytest

from gaplan.core.errors import GaplanError
from gaplan.core.options import (
    OptionError,
    check_applies,
    from_options,
    from_saved,
    leaf_fields,
    nested,
    option,
    replace_path,
    to_flat,
    to_saved,
)


@dataclass(frozen=True)
class Inner:
    path: str | None = option(None, resume="fixed", name="data")
    depth: int = option(1, resume="free")


@dataclass(frozen=True)
class Outer:
    size: int = option(2, resume="fixed")
    inner: Inner = nested(Inner)


def test_a_tree_is_built_from_one_flat_mapping_by_option_names_and_unknown_names_are_left_out():
    built = from_options(Outer, {"size": 5, "data": "corpus.txt", "depth": 3, "model": "ignored"})
    assert built == Outer(size=5, inner=Inner(path="corpus.txt", depth=3))
    assert from_options(Outer, {}) == Outer()  # an absent option keeps its default
    assert from_options(Outer, {"size": 5}, size=7).size == 7  # an override wins


def test_flat_and_back_is_the_same_tree():
    tree = Outer(size=9, inner=Inner(path="x", depth=4))
    flat = to_flat(tree)
    assert flat == {"size": 9, "data": "x", "depth": 4}
    assert from_options(Outer, flat) == tree


def test_a_typed_field_is_saved_by_its_save_mark_and_read_back_by_its_parser():
    """train.json's forms, declared on the field: a ScheduleChoice saved as its text, a Checkpointing as a plan file's
    value (False, True, "every:2") or "auto", None as None; read back into the typed values by the field's parser."""
    from gaplan.core.checkpointing import AUTO, ON, parse_checkpointing
    from gaplan.plan.schedule import parse_schedule
    from gaplan.workflows.train_options import TrainOptions

    for choice, saved in ((parse_checkpointing("every:2"), "every:2"), (ON, True), (AUTO, "auto"), (None, None)):
        options = TrainOptions(grad_checkpointing=choice, batch_schedule=parse_schedule("warmup:3"), plan_file="p.json")
        flat = to_saved(options)
        assert flat["grad_checkpointing"] == saved and flat["batch_schedule"] == "warmup:3"
        assert json.loads(json.dumps(flat)) == flat  # JSON as it is
        assert from_saved(TrainOptions, flat) == options


def test_leaf_fields_carry_their_paths_and_metadata():
    leaves = {path: field.metadata.get("resume") for path, field in leaf_fields(Outer)}
    assert leaves == {("size",): "fixed", ("inner", "path"): "fixed", ("inner", "depth"): "free"}
    assert replace_path(Outer(), ("inner", "depth"), 8).inner.depth == 8


def test_an_option_error_names_fields_for_python_and_flags_for_the_command_line():
    error = OptionError("effective_tokens needs batch_by tokens; plan_file too", "effective_tokens", "batch_by",
                        "plan_file")
    assert str(error) == "effective_tokens needs batch_by tokens; plan_file too"
    assert error.for_cli() == "--effective-tokens needs --batch-by tokens; --plan-file too"
    flags = {"plan_file": "--plan"}
    assert error.for_cli(lambda name: flags.get(name) or "--" + name.replace("_", "-")).endswith("--plan too")


def test_a_field_inside_a_longer_name_is_not_replaced():
    assert OptionError("weights_dtype fp16 with dtype fp16", "dtype", "weights_dtype").for_cli() == \
        "--weights-dtype fp16 with --dtype fp16"


@pytest.mark.parametrize("name", ["dtype", "steps"])
def test_a_name_not_listed_stays_as_it_is(name):
    assert OptionError(f"{name} is wrong").for_cli() == f"{name} is wrong"


def test_the_number_checks_refuse_nan_inf_bools_and_text():
    from gaplan.core.options import check_positive_ints, positive_finite

    assert positive_finite(1e-9) and positive_finite(3)
    assert not any(positive_finite(v) for v in (0, -1.0, float("nan"), float("inf"), True, "1", None))
    check_positive_ints(a=1, b=None)
    for bad in (0, -2, 1.0, True, "3"):
        with pytest.raises(OptionError, match=f"^b must be a positive integer \\(got {bad!r}\\)"):
            check_positive_ints(a=1, b=bad)


@dataclass(frozen=True)
class Scoped:
    """Options that apply only somewhere (``applies``), one renamed (``flag``), one in a nested object."""

    rounds: int = option(3, applies="`--report`")
    plan_file: str | None = option(None, flag="--plan", applies="a run by samples")
    everywhere: int = option(1)
    inner: Inner = nested(Inner)


@pytest.mark.parametrize("given, where, names, message", [
    (dict(rounds=4), "`--report`", None, "--rounds applies to --report"),
    (dict(plan_file="p.json"), "a run by samples", None, "--plan applies to a run by samples"),
    (dict(inner=Inner(depth=2)), "`--deep`", ("depth",), "--depth applies to --deep"),
])
def test_an_option_away_from_its_default_where_it_does_not_apply_is_refused_by_its_flag(given, where, names, message):
    with pytest.raises(GaplanError, match=f"^{message}$"):
        check_applies(Scoped(**given), where, names)


def test_options_at_their_defaults_or_applying_elsewhere_pass():
    check_applies(Scoped(), "`--report`")  # every option at its default
    check_applies(Scoped(rounds=4, everywhere=9), "a run by samples")  # rounds applies elsewhere; everywhere has none
    check_applies(Scoped(inner=Inner(depth=2)), "`--deep`", ("data",))  # only the options named are looked at
