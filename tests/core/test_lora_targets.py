"""``--lora-targets``' one parser: text, an adapter config's list, a typed value; peft's ``target_modules`` from it."""

import pytest

from gaplan.core.lora_targets import ALL_LINEAR, LoraTargets, parse_lora_targets
from gaplan.core.options import OptionError


@pytest.mark.parametrize("given, names, modules", [
    ("all-linear", ("all-linear",), ALL_LINEAR),
    (" all-linear ", ("all-linear",), ALL_LINEAR),
    ("q_proj,v_proj", ("q_proj", "v_proj"), ["q_proj", "v_proj"]),
    ("q_proj, o_proj,", ("q_proj", "o_proj"), ["q_proj", "o_proj"]),
    (["q_proj", "v_proj"], ("q_proj", "v_proj"), ["q_proj", "v_proj"]),  # adapter_config.json's target_modules
    ("c_attn", ("c_attn",), ["c_attn"]),
])
def test_each_form_gives_the_names_and_peft_target_modules(given, names, modules):
    targets = parse_lora_targets(given)
    assert targets.names == names and targets.target_modules == modules
    assert parse_lora_targets(str(targets)) == targets  # its text, as plan files and launch commands hold it
    assert parse_lora_targets(targets) is targets


def test_none_is_pefts_own_choice():
    assert parse_lora_targets(None) is None


@pytest.mark.parametrize("given", ["", " , ", ",", [], [" "]])
def test_naming_no_module_or_all_linear_with_names_is_one_line(given):
    with pytest.raises(OptionError) as caught:
        parse_lora_targets(given)
    assert caught.value.fields == ("lora_targets",) and "names no module" in str(caught.value)


def test_a_typed_value_checks_itself():
    with pytest.raises(OptionError):
        LoraTargets(())


def test_all_linear_with_names_is_one_line_saying_so():
    with pytest.raises(OptionError, match="all-linear is every linear layer, so it takes no names beside it"):
        parse_lora_targets("all-linear,c_attn")
