"""The trial worker: a child process that holds one workload under one memory budget.

The probe runs its trials here, not in the caller's process: the budget
(RLIMIT_DATA on CPU, a memory fraction on CUDA) must not constrain the caller,
glibc's mmap threshold must be pinned before the interpreter allocates, and a
fresh process is the honest test of an answer. It speaks JSON lines: the first
request names the workload, device and budget; each later one asks for a trial.

Run by :class:`gaplan.probe.WorkerProcess`; ``python -m gaplan.worker`` by hand is for debugging.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict


def _serve(requests, reply) -> None:
    setup = json.loads(requests.readline())
    import torch  # noqa: F401 - the baseline is taken after the libraries are loaded
    import transformers  # noqa: F401

    from gaplan.devices import is_out_of_memory, make_backend
    from gaplan.errors import GaplanError
    from gaplan.trial import materialize_optimizer_state, run_trial
    from gaplan.workload import WorkloadSpec, build_workload

    if setup.get("threads"):
        torch.set_num_threads(int(setup["threads"]))
    spec = WorkloadSpec(**setup["workload"])
    try:
        static = _static_bytes_without_memory(spec)
    except GaplanError as exc:
        reply({"error": "user", "message": str(exc)})
        return
    backend = make_backend(setup["device"])
    backend.activate(setup.get("limit_bytes"))
    if static is not None and static > backend.limit_bytes:
        reply({"error": "does-not-fit", "limit_bytes": backend.limit_bytes, "static_bytes": static})
        return
    try:
        workload = build_workload(spec, setup["device"], seed=int(setup.get("seed", 0)))
        if setup.get("warm_optimizer", True):
            materialize_optimizer_state(workload)
    except GaplanError as exc:
        reply({"error": "user", "message": str(exc)})
        return
    except Exception as exc:  # noqa: BLE001
        if not is_out_of_memory(exc):
            raise
        reply({"error": "does-not-fit", "limit_bytes": backend.limit_bytes, "static_bytes": static})
        return
    reply({
        "ready": True,
        "device": backend.name,
        "limit_bytes": backend.limit_bytes,
        "param_count": workload.param_count,
        "static_bytes": workload.static_bytes(),
        "task": workload.task,
        "seq_len": workload.seq_len,
        "model_type": workload.info.get("model_type"),
        "setup_bytes": backend.current_bytes(),
    })
    for line in requests:
        request = json.loads(line)
        outcome = run_trial(workload, backend, int(request["micro_batch"]),
                            micro_steps=int(request.get("micro_steps", 2)),
                            optimizer_steps=int(request.get("optimizer_steps", 1)))
        reply(asdict(outcome))


def _static_bytes_without_memory(spec) -> int | None:
    """Weights + gradients + optimizer states, counted on the meta device (nothing allocated)."""
    from gaplan.workload import build_workload, model_source_kind

    if model_source_kind(spec.model) == "function":
        return None  # a user's function may not build on meta; its size shows when it is built
    return build_workload(spec, "meta").static_bytes()


def main() -> None:
    # Keep the protocol channel private: anything a library prints goes to stderr.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def reply(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    try:
        _serve(sys.stdin, reply)
    except Exception:  # noqa: BLE001 - report, then die: the parent turns it into an error
        reply({"error": "crash", "message": traceback.format_exc(limit=5)})
        sys.exit(1)


if __name__ == "__main__":
    main()
