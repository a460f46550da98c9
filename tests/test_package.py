"""The package's public names: the API functions stay functions whatever was imported before."""

import importlib
import inspect

import gaplan


def test_api_functions_named_like_their_modules_stay_functions():
    for name in ("probe", "train", "bench"):
        module = importlib.import_module(f"gaplan.{name}")  # importing a submodule sets it on the package
        assert inspect.isfunction(getattr(gaplan, name)), name
        assert getattr(gaplan, name) is getattr(module, name)
    from gaplan import probe

    assert inspect.isfunction(probe)


def test_every_public_name_resolves():
    for name in gaplan.__all__:
        assert getattr(gaplan, name) is not None, name
