"""The private parts of torch the estimate reads or patches, each looked up through one guard.

Fake-tensor tracing leans on torch internals (``torch.distributed._tools.mem_tracker``, the fake
tensor and dispatch-mode modules). They can move or vanish between torch releases; when one is
missing the estimate stops with one line naming it and the installed torch version, instead of an
``AttributeError`` from deep inside a trace.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from gaplan.core.errors import GaplanError

TESTED_TORCH = "2.13"  # the torch release these internals were read from


def missing(what: str) -> GaplanError:
    """The one-line error for a torch internal that is not there."""
    import torch

    return GaplanError(f"gaplan estimate needs torch's {what} (missing in torch {torch.__version__}); it is written "
                       f"against torch {TESTED_TORCH}: install that version, or use gaplan probe on a real device")


def private_module(path: str) -> ModuleType:
    """``import path``, or :func:`missing` when this torch has no such module."""
    try:
        return importlib.import_module(path)
    except ImportError:
        raise missing(path) from None


def private_attr(owner: Any, name: str) -> Any:
    """``getattr(owner, name)``, or :func:`missing` naming ``Owner.name`` (a module by its dotted path)."""
    try:
        return getattr(owner, name)
    except AttributeError:
        label = getattr(owner, "__name__", type(owner).__name__)
        raise missing(f"{label}.{name}") from None


def private(path: str, name: str) -> Any:
    """``name`` from the private module ``path``, both guarded."""
    return private_attr(private_module(path), name)
