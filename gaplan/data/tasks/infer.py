"""Which task a transformers model (or its config) trains as, from the components' declarations: an encoder-decoder
config is the encoder-decoder task's, else the first architecture name that ends as a component says. Read by class
and architecture names: no transformers import."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.data.tasks.registry import REGISTRY, task_names


def _encoder_decoder_task(config: Any) -> str | None:
    if getattr(config, "is_encoder_decoder", False):
        return next((name for name, c in REGISTRY.items() if c.encoder_decoder), None)
    return None


def _by_suffix(names: Sequence[str], skip: str | None = None) -> str | None:
    for name in names:
        for task, component in REGISTRY.items():
            if task != skip and component.architecture_suffixes and name.endswith(component.architecture_suffixes):
                return task
    return None


def infer_task(model: Any) -> str:
    """gaplan's task for a transformers model, from its class name and its config's architectures (PEFT wrappers
    are looked through); one line naming the choices when no component claims it."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    config = getattr(base, "config", None)
    names = [type(base).__name__, *(getattr(config, "architectures", None) or [])]
    task = _encoder_decoder_task(config) or _by_suffix(names)
    if task is None:
        raise GaplanError(f"cannot tell the task of {type(base).__name__}: pass task= (one of {', '.join(task_names())})")
    return task


def task_of_config(config: Any, default: str) -> str:
    """The task of a model folder's config: the encoder-decoder task, else the first architecture another component
    claims, else ``default`` (a folder's config that names no known head trains as ``default``)."""
    return (_encoder_decoder_task(config)
            or _by_suffix(getattr(config, "architectures", None) or [], skip=default) or default)
