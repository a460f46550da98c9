"""A probe trial of a loop the user brings: their ``setup``, ``make_batch``, ``micro_step`` and ``optimizer_step``,
run under the budget at steady state (the optimizer's states made first, then optimizer steps of accumulated
micro-steps), measured by the same loop as gaplan's own trials (:func:`gaplan.worker.trial.measure_steps`).

Forked from the caller (closures work), or, where the caller's CUDA is initialized and cannot fork, spawned as
``python -m gaplan.worker.loop_trial`` with the functions named ``module:function`` (a JSON request on stdin, the
trial on stdout).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.core.trial import Trial

FUNCTION_NAMES = ("setup", "make_batch", "micro_step", "optimizer_step")


def default_optimizer_step(model: Any, optimizer: Any) -> None:
    """``optimizer.step()`` then ``optimizer.zero_grad(set_to_none=True)``: what most loops do."""
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class LoopFunctions:
    """The user's loop: callables, or ``"module:function"`` names of importable ones."""

    setup: Callable[[], tuple[Any, Any]] | str
    make_batch: Callable[[int], Any] | str
    micro_step: Callable[[Any, Any], Any] | str
    optimizer_step: Callable[[Any, Any], Any] | str | None = None

    def resolved(self) -> dict[str, Callable]:
        functions = {name: _resolve(getattr(self, name), name) for name in FUNCTION_NAMES[:3]}
        functions["optimizer_step"] = (_resolve(self.optimizer_step, "optimizer_step")
                                       if self.optimizer_step is not None else default_optimizer_step)
        return functions

    def references(self) -> dict[str, str | None]:
        """Every function as ``module:function``, for a spawned trial; a one-line error for one that is not importable."""
        return {name: None if getattr(self, name) is None else _reference(getattr(self, name), name)
                for name in FUNCTION_NAMES}


def _resolve(function: Callable | str, name: str) -> Callable:
    if callable(function):
        return function
    module, _, qualname = str(function).partition(":")
    if not module or not qualname:
        raise GaplanError(f"{name}={function!r}: give a callable or 'module:function'")
    try:
        value: Any = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise GaplanError(f"{name}={function!r} cannot be imported ({exc.__class__.__name__}: {exc})") from None
    if not callable(value):
        raise GaplanError(f"{name}={function!r} is not callable")
    return value


def _reference(function: Callable | str, name: str) -> str:
    if isinstance(function, str):
        return function
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise GaplanError(f"this process has initialized CUDA, so trials cannot fork from it: {name} must be "
                          f"importable in a new process (a module-level function or 'module:function'), "
                          f"not {qualname or function!r} of {module}")
    return f"{module}:{qualname}"


def _tokens(batch: Any) -> int:
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    return int(mask.sum()) if mask is not None else 0


def loop_trial(functions: dict[str, Callable], device: str, limit_bytes: int | None, micro_batch: int,
               micro_steps: int = 2, optimizer_steps: int = 2, threads: int | None = None) -> dict:
    """In a fresh child: the budget, the user's model and optimizer, their states, then the measured steps."""
    import torch

    from gaplan.devices.backend import is_out_of_memory, make_backend
    from gaplan.worker.trial import make_optimizer_states, measure_steps

    if threads:
        torch.set_num_threads(threads)
    backend = make_backend(device)
    if device == "cpu":
        from gaplan.devices.heap import seal_free_heap

        seal_free_heap()  # forked from your process: its freed heap must not hold the trial's memory uncounted
    backend.activate(limit_bytes)
    setup, make_batch, micro_step, optimizer_step = (functions[name] for name in FUNCTION_NAMES)
    try:
        model, optimizer = setup()
        make_optimizer_states(model, optimizer, lambda: optimizer_step(model, optimizer))
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        return Trial(micro_batch, False, error="the model and its optimizer states themselves do not fit").to_dict()

    def accumulate() -> tuple[int, Any]:
        batch = None
        for _ in range(micro_steps):
            batch = make_batch(micro_batch)  # as a loop variable: the previous batch lives until this one exists
            micro_step(model, batch)
        return _tokens(batch) * micro_steps, batch

    trial = measure_steps(backend, micro_batch, optimizer_steps, accumulate, lambda: optimizer_step(model, optimizer),
                          recover=lambda: optimizer.zero_grad(set_to_none=True))
    return trial.to_dict()


def main() -> None:
    """A spawned trial: the request (functions by name, device, budget, size) on stdin, the trial on stdout."""
    request = json.load(sys.stdin)
    functions = LoopFunctions(**request.pop("functions")).resolved()
    try:
        message = loop_trial(functions, **request)
    except GaplanError as exc:
        message = {"error": "user", "message": str(exc)}
    print(json.dumps(message), flush=True)


if __name__ == "__main__":
    main()
