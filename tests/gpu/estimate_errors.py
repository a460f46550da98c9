"""The estimate's predicted peak against a real CUDA trial's ``max_memory_reserved``, at each micro-batch: the
relative errors (the GPU checks of the estimate share it)."""

from __future__ import annotations


def estimate_errors(spec, sizes) -> list[float]:
    from gaplan.estimate import trace_steps
    from gaplan.worker.client import WorkerProcess

    predicted = {row.micro_batch: row.peak_bytes for row in trace_steps(spec, sizes, device_kind="cuda")}
    errors = []
    with WorkerProcess(spec, "cuda:0", None) as worker:
        for size in sizes:
            measured = worker.trial(size, optimizer_steps=2).peak_bytes
            errors.append((predicted[size] - measured) / measured)
    return errors
