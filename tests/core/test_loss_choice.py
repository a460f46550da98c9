"""``--loss``'s one parser: every text form to its typed value and back, a typed value through, the rest refused."""

import pytest

from gaplan.core.loss_choice import PLAIN, LossChoice, parse_loss
from gaplan.core.options import OptionError


@pytest.mark.parametrize("text, chunk_tokens", [("plain", None), ("chunked", 0), ("chunked:1", 1),
                                                ("chunked:1024", 1024)])
def test_each_form_parses_to_its_value_and_prints_back_as_given(text, chunk_tokens):
    choice = parse_loss(text)
    assert choice == LossChoice(chunk_tokens) and str(choice) == text
    assert choice.chunked == (chunk_tokens is not None) and choice.kind == text.partition(":")[0]
    assert parse_loss(choice) is choice  # a typed value (a default, what --print-config wrote) passes through


@pytest.mark.parametrize("text", ["", "Plain", "plain:4", "chunked:", "chunked:0", "chunked:-2", "chunked:x",
                                  "chunked:1.5", "chunked:4:4", "sum"])
def test_anything_else_is_one_line_naming_the_loss(text):
    with pytest.raises(OptionError) as caught:
        parse_loss(text)
    assert caught.value.fields == ("loss",) and "\n" not in str(caught.value)


@pytest.mark.parametrize("tokens", [-1, True, 2.0, "4"])
def test_a_typed_value_checks_its_own_chunk(tokens):
    with pytest.raises(OptionError):
        LossChoice(tokens)


def test_the_default_is_plain():
    assert PLAIN == parse_loss("plain") and not PLAIN.chunked and PLAIN.chunk_tokens is None
