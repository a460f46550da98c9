"""A field is the option: docs/design.md's "add an option" recipe, run on a dataclass of its own. The field's flag,
help, --help section, type (its one parser), default and config table all come from the field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import click
import pytest
from click.testing import CliRunner

from gaplan.cli.config_file import GaplanCommand
from gaplan.cli.field_options import field_options
from gaplan.cli.option_types import BYTES
from gaplan.core.options import MEMORY, PLAN, TRAINING, from_options, nested, option
from gaplan.core.units import parse_bytes


@dataclass(frozen=True)
class Knobs:
    CONFIG_TABLE: ClassVar[str] = "knobs"

    budget: int | None = option(None, section=MEMORY, parse=parse_bytes, metavar="SIZE", help="A budget in bytes.")
    fast: bool = option(True, section=TRAINING, help="Go fast.")


@dataclass(frozen=True)
class Toy:
    size: int | None = option(None, section=PLAN, help="A size.")
    knobs: Knobs = nested(Knobs)
    internal: int = 3  # no help: not an option


SEEN: list[dict[str, Any]] = []


@click.command(name="toy", cls=GaplanCommand)
@field_options(Toy)
def toy(**options: Any) -> None:
    SEEN.append(options)


def test_the_fields_make_the_options_each_typed_by_its_one_parser():
    SEEN.clear()
    result = CliRunner().invoke(toy, ["--size", "3", "--budget", "2GiB", "--no-fast"])
    assert result.exit_code == 0, result.output
    assert SEEN == [{"size": 3, "budget": 2 * 2**30, "fast": False}]  # "internal" has no option
    assert from_options(Toy, SEEN[0]) == Toy(size=3, knobs=Knobs(budget=2 * 2**30, fast=False))
    params = {param.name: param for param in toy.params}
    assert params["budget"].type is BYTES  # the one click type of parse_bytes, as every command's --memory-limit
    assert params["fast"].opts == ["--fast"] and params["fast"].secondary_opts == ["--no-fast"]


def test_the_fields_help_and_section_are_the_helps():
    text = CliRunner().invoke(toy, ["--help"]).stdout
    memory, plan, training = (text.index(f"\n{name}:\n") for name in ("Memory", "Plan", "Training"))
    assert memory < text.index("--budget SIZE") < plan < text.index("--size INTEGER") < training < text.index("--fast")
    for field in (*dataclasses.fields(Toy)[:1], *dataclasses.fields(Knobs)):
        assert field.metadata["help"] in " ".join(text.split())


def test_the_config_file_tables_are_the_objects(tmp_path):
    printed = CliRunner().invoke(toy, ["--size", "3", "--budget", "1KiB", "--print-config"]).stdout
    assert printed == "[toy]\nsize = 3\n\n[toy.knobs]\nbudget = 1024\nfast = true\n"
    path = tmp_path / "toy.toml"
    path.write_text(printed)
    SEEN.clear()
    assert CliRunner().invoke(toy, ["--config", str(path)]).exit_code == 0
    assert SEEN == [{"size": 3, "budget": 1024, "fast": True}]


@pytest.mark.parametrize("command", ["probe", "estimate", "plan"])
def test_the_model_help_names_every_preset(command):
    """The --model help is written by hand: each preset gaplan builds is named there (estimate's listed none of the
    llama shapes its own examples use)."""
    from gaplan.cli.main import main
    from gaplan.workload.spec import PRESETS

    shown = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=200).output.split())
    assert all(preset in shown for preset in PRESETS), [p for p in PRESETS if p not in shown]
