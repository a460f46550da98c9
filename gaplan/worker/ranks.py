"""A trial over several ranks (FSDP): W forked processes in one process group, each under its own budget. No torch.

A sharded run's memory depends on the world size (each rank holds 1/W of the parameters, gradients and
optimizer states), so its trial must run every rank: :mod:`gaplan.worker.serve` forks W children per trial
(:func:`run_ranks`), they join a fresh process group (a new FileStore per trial), each sets its own
budget, builds the workload, shards it and trains. A size fits only if it fits on every rank; the trial's
peak is the largest rank's peak (:func:`merge_trials`).

How the ranks agree on an out-of-memory error: they do not vote; the parent decides. FSDP's collectives
(an all-gather in each block's forward and backward, a reduce-scatter in the synchronizing backward) are
issued inside the model's own forward and backward, so a rank that fails in the middle of a forward cannot
reach the rest of them, and an all-reduce of a failure flag would wait behind an all-gather it never
issues. Instead each rank reports to the parent through its own pipe as soon as its trial ends, fitted or
not, and then waits. The first failure (an out-of-memory trial, an error, or a rank killed by a signal:
the kernel's OOM killer) ends the trial at once: the parent SIGKILLs every other rank wherever it waits (in
a collective, usually) and reaps it. When every rank has reported, the parent kills them all too: no rank
exits on its own while a peer may still read from its sockets. A trial that has not ended after
``timeout_s`` is killed whole and reported as a crash (a hang is a bug, not a verdict on memory).
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable

STOPPED = "stopped"  # a rank the parent ended because another failed first (or the trial timed out)


def run_ranks(ranks: int, work: Callable[[int], dict], timeout_s: float | None = None) -> list[dict]:
    """Run ``work(rank)`` for every rank at once, each in a forked child; their dicts, in rank order.

    A child that died without a reply is ``{"error": "killed", ...}`` (by a signal) or ``{"error": "crash"}``;
    one ended by the parent after another rank failed is ``{"error": "stopped"}``.
    """
    children: dict[int, tuple[int, int]] = {}  # read end -> (rank, pid)
    for rank in range(ranks):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            for fd in [read_end, *children]:  # the child keeps only its own write end
                os.close(fd)
            _rank_child(work, rank, write_end)
        os.close(write_end)
        children[read_end] = (rank, pid)
    results: list[dict | None] = [None] * ranks
    chunks: dict[int, list[bytes]] = {fd: [] for fd in children}
    waiting = set(children)
    reaped: set[int] = set()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    why_stopped = "another rank failed first"
    try:
        while waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(sorted(waiting), [], [], left)
            if not ready:
                why_stopped = f"the trial did not end within {timeout_s:g} s"
                break
            failed = False
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    chunks[fd].append(chunk)
                    continue
                waiting.discard(fd)
                rank, pid = children[fd]
                text = b"".join(chunks[fd]).decode()
                if text:
                    results[rank] = json.loads(text)
                else:  # no reply: the rank died (reap it to learn how)
                    _, status = os.waitpid(pid, 0)
                    reaped.add(pid)
                    results[rank] = _death(status)
                failed = failed or is_failure(results[rank])
            if failed:
                break
    finally:
        for fd, (rank, pid) in children.items():
            if pid not in reaped:
                _kill(pid)
            os.close(fd)
            if results[rank] is None:
                results[rank] = {"error": STOPPED, "message": f"rank {rank} stopped: {why_stopped}"}
    return [r for r in results if r is not None]


def is_failure(result: dict | None) -> bool:
    """A rank's reply that ends the trial: it did not fit, or it failed in any other way."""
    if result is None:
        return False
    if "fits" in result:  # a trial's record (its ``error`` is None when it fitted)
        return result["fits"] is False
    return result.get("error") is not None


def _rank_child(work: Callable[[int], dict], rank: int, write_end: int) -> None:
    """In a rank's child: run, reply, close the pipe, then wait for the parent's SIGKILL. Never returns."""
    try:
        message = work(rank)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as data
        from gaplan.core.errors import GaplanError
        from gaplan.core.options import error_reply

        if isinstance(exc, GaplanError):
            message = error_reply(exc)
        else:
            message = {"error": "crash", "message": f"rank {rank}: " + traceback.format_exc(limit=6)}
    try:
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps(message))
        # Stay alive until the parent ends every rank: a rank that exits closes its sockets under a peer
        # that may not have read its last message yet.
        while True:
            signal.pause()
    finally:
        os._exit(1)


def _death(status: int) -> dict:
    if os.WIFSIGNALED(status):
        # SIGKILL that the parent did not send: the kernel's OOM killer (or a user); reported as out of memory.
        return {"error": "killed", "message": f"trial process killed by {signal.Signals(os.WTERMSIG(status)).name}"}
    return {"error": "crash", "message": f"trial process exited with status {os.waitstatus_to_exitcode(status)}"}


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def merge_trials(micro_batch: int, results: list[dict]) -> dict:
    """One trial (a :class:`gaplan.core.trial.Trial` dict) from every rank's reply, or the error that ended it.

    Fits only if every rank fitted; the peaks are the largest rank's (``rank_peak_bytes`` keeps each);
    times are the slowest rank's; tokens add up over the ranks. A failure is taken in this order: a rank
    that ran out of memory (its allocator's message, prefixed by its rank), a rank killed by a signal,
    then an error (returned as it is: the worker reports it as a crash).
    """
    for rank, result in enumerate(results):
        if result.get("fits") is False:
            error = result.get("error") or "out of memory"
            return dict(result, error=f"rank {rank}: {error}", peak_bytes=None, micro_steps_peak_bytes=None,
                        rank_peak_bytes=None)
    for rank, result in enumerate(results):
        if result.get("error") == "killed":
            return {"micro_batch": micro_batch, "fits": False, "error": f"rank {rank}: {result['message']}"}
    for result in results:
        if result.get("error") in ("user", "crash"):
            return result
    if any(result.get("error") for result in results):  # every rank stopped: the trial timed out
        return {"error": "crash", "message": "; ".join(r["message"] for r in results if r.get("message"))}
    peaks = [r["peak_bytes"] for r in results]
    steps = [r["step_seconds"] for r in results]
    return dict(
        results[0],
        peak_bytes=max(peaks),
        micro_steps_peak_bytes=max(r["micro_steps_peak_bytes"] for r in results),
        seconds=max(r["seconds"] for r in results),
        completed_steps=min(r["completed_steps"] for r in results),
        step_seconds=[max(times) for times in zip(*steps, strict=True)],
        step_cpu_seconds=[],  # ranks also wait for each other in collectives: no sign of contention to read here
        tokens_per_step=sum(r["tokens_per_step"] for r in results),
        before_bytes=max(r["before_bytes"] for r in results),
        after_bytes=max(r["after_bytes"] for r in results),
        rank_peak_bytes=peaks,
    )


def merge_ready(results: list[dict]) -> dict:
    """The worker's ready message from every rank's: the largest static and setup bytes, or the first failure."""
    for result in results:
        if result.get("error") == "does-not-fit":
            return dict(result, static_bytes=max((r.get("static_bytes") or 0) for r in results) or None)
    for rank, result in enumerate(results):
        if result.get("error") == "killed":
            return {"error": "does-not-fit", "limit_bytes": None, "static_bytes": None,
                    "message": f"rank {rank}: {result['message']}"}
    for result in results:  # a rank's own error before the "stopped" of the ranks ended for it
        if result.get("error") in ("user", "crash"):
            return result
    for result in results:
        if "error" in result:
            return result
    return dict(results[0], static_bytes=max(r["static_bytes"] for r in results),
                setup_bytes=max(r["setup_bytes"] for r in results))
