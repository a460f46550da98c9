"""A probe trial of a loop the user brings: their ``setup``, ``make_batch``, ``micro_step`` and ``optimizer_step``,
run under the budget as the loop runs, measured by the same loop as gaplan's own trials
(:func:`gaplan.worker.trial.measure_steps`). The optimizer makes its states itself, at its first ``step()`` (AdamW's
lazy creation, as in the user's loop): states made before, another way, land in the heap at another moment and cost
a sample at the edge on CPU (measured on a nanoGPT loop at 1 GiB). The first optimizer step is therefore the
loop's own first, and the steady state is measured from the second on; the trial's peak is the larger.

Forked from the caller (closures work), or, where the caller's CUDA is initialized and cannot fork, spawned as
``python -m gaplan.worker.loop_trial``: the request pickled on stdin, the trial as JSON on stdout. A spawned trial
gets the functions pickled (module-level functions and picklable objects, ``module:function`` names), after it
has loaded the caller's main script as ``multiprocessing``'s spawn does (``__mp_main__``, its ``if __name__ ==
"__main__":`` block not run), so a script's own functions work there too; a lambda or a closure cannot.
"""

from __future__ import annotations

import importlib
import json
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaplan.core.errors import GaplanError, one_line
from gaplan.core.options import error_reply
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

    def pickled(self, why: str = "this process has initialized CUDA, so trials cannot fork from it and run in new "
                                 "processes") -> bytes:
        """The functions for a spawned trial; a one-line error for one that a new process cannot have (``why``: why
        the trials are new processes)."""
        for name in FUNCTION_NAMES:
            function = getattr(self, name)
            try:
                pickle.dumps(function)
            except Exception as exc:  # noqa: BLE001 - PicklingError, AttributeError, TypeError: all say the same
                qualname = getattr(function, "__qualname__", repr(function))
                raise GaplanError(f"{why}: {name} must be picklable there (a module-level function, a picklable "
                                  f"object or 'module:function'), not {qualname} ({one_line(str(exc))})") from None
        return pickle.dumps(self)


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


def _tokens(batch: Any) -> int:
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    return int(mask.sum()) if mask is not None else 0


def loop_trial(functions: dict[str, Callable], device: str, limit_bytes: int | None, micro_batch: int,
               micro_steps: int = 2, optimizer_steps: int = 2, threads: int | None = None) -> dict:
    """In a fresh child: the budget, the user's model and optimizer, then ``optimizer_steps`` steps as the loop runs
    them (the first makes the optimizer's states), each measured."""
    import torch

    from gaplan.devices.backend import is_out_of_memory, make_backend
    from gaplan.worker.trial import measure_steps

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
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        return Trial(micro_batch, False, error="the model and its optimizer themselves do not fit").to_dict()

    def accumulate() -> tuple[int, Any]:
        batch = None
        for _ in range(micro_steps):
            batch = make_batch(micro_batch)  # as a loop variable: the previous batch lives until this one exists
            micro_step(model, batch)
        return _tokens(batch) * micro_steps, batch

    trial = measure_steps(backend, micro_batch, optimizer_steps, accumulate, lambda: optimizer_step(model, optimizer),
                          recover=lambda: optimizer.zero_grad(set_to_none=True))
    return trial.to_dict()


def spawn_request(functions: LoopFunctions, **trial: Any) -> bytes:
    """What a spawned trial reads on stdin: how to load the caller's main script, the functions, the trial's fields."""
    from multiprocessing import spawn

    preparation = spawn.get_preparation_data("gaplan-trial")
    preparation.pop("authkey", None)  # this child talks through its pipes, not multiprocessing's connections
    return pickle.dumps({"preparation": preparation, "functions": functions.pickled(), "trial": trial})


def main() -> None:
    """A spawned trial: the pickled request (:func:`spawn_request`) on stdin, the trial as JSON on stdout."""
    from multiprocessing import spawn

    request = pickle.loads(sys.stdin.buffer.read())
    own_path = list(sys.path)
    try:
        spawn.prepare(request["preparation"])  # the caller's sys.path and main script: its functions unpickle here
        sys.path.extend(entry for entry in own_path if entry not in sys.path)  # and this child's PYTHONPATH still
        functions = pickle.loads(request["functions"]).resolved()
        message = loop_trial(functions, **request["trial"])
    except GaplanError as exc:
        message = error_reply(exc)
    print(json.dumps(message), flush=True)


if __name__ == "__main__":
    main()
