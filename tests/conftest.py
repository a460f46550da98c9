"""Shared fixtures: one small probe reused by several tests, to keep the suite fast."""

import os

import pytest
from hypothesis import settings

from gaplan.core.constants import SEARCH_CAP

# Property tests draw the same cases on every run, so a CI run cannot fail on a case no earlier run drew (one did:
# the sketch bound in test_search.py). HYPOTHESIS_PROFILE=explore draws new cases, to hunt for counterexamples.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# A small workload whose memory line is steep enough for the edge to be sharp and the trials quick.
SMALL_SPEC = dict(model="tiny-gpt2", seq_len=16)
SMALL_BUDGET = 256 * 2**20
SMALL_THREADS = 1

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    """A TCP port nothing listens on now, for a torchrun rendezvous: fixed ports clash when two test runs (a CI
    clone and a checkout) share a machine, and a clash aborts a rank."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_logs_of_one_process_and_two_ranks(tmp_path, args: list[str]) -> tuple[list[dict], list[dict]]:
    """``gaplan train ARGS`` in one process and over 2 ranks under torchrun (gloo): each run's train_log.csv rows."""
    import csv
    import subprocess
    import sys

    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"))
    logs = []
    for name, launch in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc-per-node", "2",
                                               "--master-port", str(free_port())])):
        done = subprocess.run([sys.executable, *launch, "-m", "gaplan", "train", *args, "--out", str(tmp_path / name)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        with open(tmp_path / name / "train_log.csv") as handle:
            logs.append(list(csv.DictReader(handle)))
    return logs[0], logs[1]


@pytest.fixture(scope="session")
def small_probe():
    from gaplan.probing.edge import probe
    from gaplan.workload.spec import WorkloadSpec

    # One thread: a second intra-op thread that mallocs gets its own glibc arena, whose reserved address space
    # counts against RLIMIT_DATA; whether it does depends on scheduling, which moves the edge by one under load.
    return probe(WorkloadSpec(**SMALL_SPEC), device="cpu", memory_limit=SMALL_BUDGET, effective_batch=256,
                 search_cap=SEARCH_CAP, threads=SMALL_THREADS)


# CI's time is bounded (90 minutes for the install, the default run and -m heavy together), and the machines it runs
# on differ in speed by 2x. GAPLAN_TEST_DEADLINE (seconds since the epoch) makes every test that would start after it
# a skip that says why, so a slow machine ends with the heavy tests it reached run and the rest counted as skipped,
# never cut off in the middle. Unset (a developer's run), nothing is skipped.
_DEADLINE = float(os.environ.get("GAPLAN_TEST_DEADLINE", "0") or 0)


def pytest_runtest_setup(item):
    import time

    if _DEADLINE and time.time() > _DEADLINE:
        pytest.skip("the CI time budget (GAPLAN_TEST_DEADLINE) is spent: run it with python -m pytest -m heavy")
