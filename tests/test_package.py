"""The package's public names: the API functions are functions, whatever was imported before."""

import importlib
import inspect
import subprocess
import sys

import pytest

import gaplan


@pytest.mark.parametrize("name, module", [("probe", "gaplan.probing.edge"), ("train", "gaplan.training.loop"),
                                          ("bench", "gaplan.benchmark.splits")])
def test_api_functions_stay_functions_after_their_modules_are_imported(name, module):
    importlib.import_module(module)
    assert inspect.isfunction(getattr(gaplan, name)), name
    assert getattr(gaplan, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(ModuleNotFoundError):  # no module shadows the function's name
        importlib.import_module(f"gaplan.{name}")


def test_every_public_name_is_a_class_or_function():
    for name in gaplan.__all__:
        value = getattr(gaplan, name)
        assert name == "__version__" or inspect.isclass(value) or inspect.isfunction(value), name


def test_the_pure_parts_and_the_cli_import_no_torch():
    """`gaplan --help`, plan files, reports and the search must not pay for importing torch."""
    code = ("import sys, gaplan, gaplan.cli.main, gaplan.plan.split, gaplan.plan.search, gaplan.runs.schema, "
            "gaplan.runs.probe_result, gaplan.probing.cache, gaplan.report.write; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_floors_are_what_the_code_calls_and_the_readme_says_them():
    """torch 2.8 for FSDP2's set_force_sum_reduction_for_comms, transformers 5.0 for the QLoRA layer rule's imports;
    the README names the same floors. (The installed versions meet them, and have what the floors are for.)"""
    import importlib.metadata
    import pathlib
    import re

    import torch
    from packaging.version import Version
    from torch.distributed.fsdp import FSDPModule
    from transformers.quantizers.base import get_keys_to_not_convert  # noqa: F401
    from transformers.quantizers.quantizers_utils import should_convert_module  # noqa: F401

    root = pathlib.Path(__file__).resolve().parents[1]
    pyproject, readme = (root / "pyproject.toml").read_text(), (root / "README.md").read_text()
    floors = dict(re.findall(r'"(torch|transformers)>=([\d.]+)"', pyproject))
    assert floors == {"torch": "2.8", "transformers": "5.0"}
    for name, floor in floors.items():
        assert f"`{name}>={floor}`" in readme
        assert Version(importlib.metadata.version(name)) >= Version(floor)
    assert hasattr(FSDPModule, "set_force_sum_reduction_for_comms") and hasattr(torch, "OutOfMemoryError")


def test_the_readmes_api_table_is_the_public_api():
    """The README shows the public API in full: its table's names are ``gaplan.__all__`` (less ``__version__``)."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("The whole public API", 1)[1].split("\n\n", 2)[1]
    named = {name for line in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", line.split("|")[2])}
    assert named == set(gaplan.__all__) - {"__version__"}
