"""Where the caller's process holds a CUDA context, ``probe_loop``'s trials are spawned, not forked: the decision.

No GPU here: the context is a stand-in, ``cuda_initialized`` forced to answer True (what
``torch.cuda.is_initialized()`` says after a user's script moved a tensor to the card). On a card,
``tests/gpu/test_gpu.py::test_a_loop_probed_after_the_caller_touched_cuda_is_spawned`` runs the same path for real.
"""

from __future__ import annotations

import pytest
import torch

import gaplan
from gaplan.core.errors import GaplanError
from gaplan.probing import loop
from gaplan.probing.loop import SPAWNED_NOTE, trial_start
from tests.tiny_loop import make_batch, micro_step, setup


@pytest.mark.parametrize("start, context, spawned, note", [
    ("auto", False, False, None),
    ("auto", True, True, SPAWNED_NOTE),
    ("spawn", False, True, None),
    ("spawn", True, True, None),  # asked for: nothing to explain
    ("fork", False, False, None),
])
def test_how_trials_start(start, context, spawned, note):
    assert trial_start(start, context) == (spawned, note)


def test_fork_is_refused_where_cuda_is_initialized_and_a_bad_start_is_one_line():
    with pytest.raises(GaplanError, match="start='fork': this process has initialized CUDA.*start='spawn'"):
        trial_start("fork", True)
    with pytest.raises(GaplanError, match=r"^start must be 'auto', 'fork' or 'spawn' \(got 'forkserver'\)$"):
        trial_start("forkserver", False)


@pytest.fixture
def cuda_context(monkeypatch):
    """A stand-in for an initialized CUDA context in this process; no trial may fork from it."""
    monkeypatch.setattr(loop, "cuda_initialized", lambda: True)
    monkeypatch.setattr(loop, "run_in_child", lambda work: pytest.fail("a trial was forked from a CUDA process"))


def test_a_closure_gets_one_line_that_names_the_fix_before_any_trial(cuda_context, monkeypatch):
    monkeypatch.setattr(loop.subprocess, "run", lambda *a, **k: pytest.fail("a trial was spawned"))
    with pytest.raises(GaplanError) as caught:
        gaplan.probe_loop(setup, lambda b: torch.randn(b, 8), micro_step, memory_limit="256MiB", effective_batch=4)
    message = str(caught.value)
    assert "\n" not in message
    assert "make_batch must be picklable" in message and "a module-level function" in message
    assert "'module:function'" in message and "test_a_closure_gets_one_line" in message  # which one, and the fix


@pytest.mark.slow  # three new interpreters, ~2.5 s each
def test_picklable_functions_are_spawned_and_the_result_says_so_once(cuda_context):
    """Real spawned trials (new interpreters, the functions pickled), from a process that says it holds a context."""
    trials = []
    result = gaplan.probe_loop(setup, make_batch, micro_step, memory_limit="256MiB", effective_batch=1,
                               on_trial=trials.append)
    assert result.spawned and result.notes.count(SPAWNED_NOTE) == 1 and len(result.notes) == 1
    assert result.max_micro_batch == 1 and result.capped
    assert trials and all(t.fits and t.completed_steps >= 1 and t.peak_bytes > 0 for t in trials)
