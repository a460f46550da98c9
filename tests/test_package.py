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
