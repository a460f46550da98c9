"""A ``module:function`` model: what the function returns (:class:`CustomWorkload`), the function imported from the
current directory as ``python -m`` would, called, and its return checked; an error in the user's code is one line
naming it (``--debug`` shows its traceback)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gaplan.core.errors import GaplanError, is_out_of_memory, mark_user_code, one_line
from gaplan.plan.draws import Drawing


@dataclass
class CustomWorkload:
    """What a ``module:function`` model returns.

    Args:
        model: any ``nn.Module``.
        make_batch: ``make_batch(b)`` returns a dict of tensors for ``b`` samples.
        loss: ``loss(model, batch)`` returns a scalar; default ``model(**batch)``'s ``loss``.
        loss_is_scaled_for_ga: True if ``loss`` already divides by ``num_items_in_batch``
            (passed as ``batch["num_items_in_batch"]``); False for a per-batch mean.
        draws: how ``make_batch`` draws its samples, for the gradient noise scale (:mod:`gaplan.plan.draws`):
            ``"independent"`` (with replacement, or fresh samples each call), ``N`` (each call takes its samples
            without replacement from ``N`` samples, independently of other calls), or None: not said, and the
            noise scale then says that it assumed independent draws.
    """

    model: nn.Module
    make_batch: Callable[[int], Mapping[str, torch.Tensor]]
    loss: Callable[[nn.Module, Mapping[str, Any]], torch.Tensor] | None = None
    loss_is_scaled_for_ga: bool = False
    draws: str | int | None = None


def load_function(target: str) -> Callable[[], Any]:
    """Import ``module:function`` (the current directory is importable, as with ``python -m``)."""
    module_name, _, func_name = target.partition(":")
    if not module_name or not func_name:
        raise GaplanError(f"model {target!r}: expected module:function, e.g. mypkg.models:make_resnet")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GaplanError(f"model {target!r}: cannot import {module_name} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the user's module itself fails (a SyntaxError, its own raise)
        raise mark_user_code(GaplanError(f"model {target!r}: importing {module_name} raised "
                                         f"{type(exc).__name__}: {one_line(exc)}")) from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise GaplanError(f"model {target!r}: {module_name} has no function {func_name}")
    return func


def made_by_function(target: str) -> CustomWorkload:
    """What the ``module:function`` model ``target`` returns, checked; an error of its own is one line (an OOM is
    the probe's: it is raised as it is)."""
    function = load_function(target)
    try:
        made = function()
    except GaplanError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's function fails: theirs to mend (an OOM is the probe's)
        if is_out_of_memory(exc):
            raise
        raise mark_user_code(GaplanError(f"model {target!r} raised {type(exc).__name__}: {one_line(exc)}")) from exc
    if isinstance(made, tuple) and 2 <= len(made) <= 3:
        made = CustomWorkload(*made)
    if not isinstance(made, CustomWorkload):
        raise GaplanError(f"model {target!r} must return gaplan.CustomWorkload or (model, make_batch[, loss]) "
                          f"(got {type(made).__name__})")
    wrong = ("its model is not a torch.nn.Module" if not isinstance(made.model, nn.Module) else
             "its make_batch is not callable" if not callable(made.make_batch) else
             "its loss is not callable" if not (made.loss is None or callable(made.loss)) else None)
    if wrong:  # what it returned is the right kind, one of its parts is not
        raise GaplanError(f"model {target!r} returned a workload, but {wrong}")
    try:
        Drawing.declared(made.draws)
    except ValueError as exc:
        raise GaplanError(f"model {target!r}: {exc}") from None
    return made
