"""docs/options.md is rendered from the commands: a changed help, a new option or one moved to another section fails
here until the page is re-rendered (python -m gaplan.cli.reference docs/options.md)."""

import pathlib

from gaplan.cli.main import main
from gaplan.cli.reference import BLOCK, options_table, render_page

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "options.md"


def test_the_option_reference_is_the_commands_own_help():
    text = PAGE.read_text()
    assert sorted(m.group(3) for m in BLOCK.finditer(text) if m.group(2) == "options_table") == sorted(
        main.list_commands())  # every command
    assert render_page(text) == text


def test_a_row_is_the_fields_help_in_its_section():
    """The text comes from the field (written once), the section from its metadata."""
    from gaplan.training.config import LoopOptions

    help_text = LoopOptions.__dataclass_fields__["checkpoint_every"].metadata["help"]
    table = options_table("train")
    training = table.split("**Training**")[1].split("**")[0]
    assert f"| `--checkpoint-every INTEGER` | {help_text} [default: 0] |" in training
