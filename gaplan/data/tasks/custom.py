"""custom: what a ``module:function`` model trains as. Its function makes its batches and its loss; a step's
``num_items_in_batch`` is its samples."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.core.tasks import CUSTOM
from gaplan.data.tasks.component import TaskComponent, batch_size


class Custom(TaskComponent):
    name = CUSTOM
    selectable = False

    def add_labels(self, batch: dict[str, Any], samples: Sequence[Any], seed: int, mask_id: int | None) -> None:
        """None: the workload's own loss reads what it needs from the inputs."""

    def fake_labels(self, ids: Any, generator: Any, vocab_size: int, num_labels: int, target_len: int | None) -> Any:
        raise GaplanError("a module:function workload makes its own batches (its make_batch), not gaplan")

    def count_step_targets(self, micro_batches: Iterable[Mapping[str, Any]]) -> int:
        return sum(batch_size(mb) for mb in micro_batches)
