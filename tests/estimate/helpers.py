"""Helpers shared by the estimate tests."""

from __future__ import annotations

import pytest


def one_line(exc: pytest.ExceptionInfo) -> str:
    """The error's message, checked to be one line."""
    message = str(exc.value)
    assert "\n" not in message
    return message


def model_parameters(preset: str):
    """The trainable parameters of a preset, built on the meta device."""
    from gaplan.workload.build import WorkloadSpec, build_workload

    return [p for p in build_workload(WorkloadSpec(model=preset), "meta").model.parameters() if p.requires_grad]
