"""The table of training tasks by name: the one place a task is listed. A new task is a new file in this package
(a :class:`~gaplan.data.tasks.component.TaskComponent`) and one entry here."""

from __future__ import annotations

from gaplan.core.errors import GaplanError
from gaplan.data.tasks.causal_lm import CausalLM
from gaplan.data.tasks.classification import Classification
from gaplan.data.tasks.component import TaskComponent
from gaplan.data.tasks.custom import Custom
from gaplan.data.tasks.masked_lm import MaskedLM
from gaplan.data.tasks.seq2seq_lm import Seq2SeqLM

REGISTRY: dict[str, TaskComponent] = {c.name: c for c in (CausalLM(), MaskedLM(), Classification(), Seq2SeqLM(),
                                                           Custom())}


def task_names() -> tuple[str, ...]:
    """The tasks ``--task`` may name, in the table's order."""
    return tuple(name for name, component in REGISTRY.items() if component.selectable)


def task_component(name: str) -> TaskComponent:
    """The component of task ``name``; one line naming the choices for an unknown one."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise GaplanError(f"unknown task {name!r}; choose one of {', '.join(task_names())}") from None


def known_task(name: str | None) -> TaskComponent | None:
    """The component of task ``name``, or None for none or a name gaplan does not know (an old plan's ``?``)."""
    return REGISTRY.get(name) if isinstance(name, str) else None


def tasks_taking(option: str) -> tuple[str, ...]:
    """The tasks ``option`` (one of :data:`~gaplan.data.tasks.component.TASK_OPTIONS`) applies to."""
    return tuple(name for name, component in REGISTRY.items() if option in component.options)
