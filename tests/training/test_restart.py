"""Out of memory under FSDP, redone through torchrun's restart: the markers, the ranks' agreement, and the
resumed run's smaller micro-batch. (The whole path under torchrun, with a real OOM, is the heavy
tests/cli/test_train_fsdp.py::test_an_oom_under_fsdp_with_a_torchrun_restart_is_redone_at_half_the_micro_batch.)"""

import dataclasses

import pytest

from gaplan.data import SyntheticCorpus
from gaplan.parallel.process_group import Distributed
from gaplan.plan.split import make_plan
from gaplan.training.loop import TrainConfig, train
from gaplan.training.restart import agree_on_restart, restarts_left, write_marker
from gaplan.workload.build import build_workload
from tests.tolerances import assert_close_at_scale

from .test_loop import SPEC


def test_no_marker_is_no_restart(tmp_path):
    assert agree_on_restart(str(tmp_path), Distributed()) is None


def test_the_smallest_size_of_every_marker_is_agreed_and_the_markers_are_removed(tmp_path):
    write_marker(str(tmp_path), 0, micro_batch=48, token_budget=None, message="step 3: rank 0 ran out of memory")
    write_marker(str(tmp_path), 1, micro_batch=24, token_budget=None, message="step 3: rank 1 ran out of memory")
    (tmp_path / "oom-restart.rank2.json").write_text("{half a fi")  # a torn file is skipped, not fatal
    restart = agree_on_restart(str(tmp_path), Distributed())
    assert restart.micro_batch == 24 and restart.token_budget is None
    assert restart.messages == ["step 3: rank 0 ran out of memory", "step 3: rank 1 ran out of memory"]
    assert not list(tmp_path.glob("oom-restart.rank*.json"))
    assert agree_on_restart(str(tmp_path), Distributed()) is None, "a later start is no restart"


def test_a_token_budget_marker_gives_the_budget(tmp_path):
    write_marker(str(tmp_path), 1, micro_batch=None, token_budget=320, message="by tokens")
    restart = agree_on_restart(str(tmp_path), Distributed())
    assert restart.micro_batch is None and restart.token_budget == 320


@pytest.mark.parametrize("env, left", [({}, False), ({"TORCHELASTIC_MAX_RESTARTS": "1"}, True),
                                       ({"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_RESTART_COUNT": "1"}, False),
                                       ({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RESTART_COUNT": "1"}, True)])
def test_restarts_left_reads_torchruns_counts(monkeypatch, env, left):
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert restarts_left() is left


@pytest.mark.slow
def test_a_resumed_run_under_a_micro_batch_limit_trains_the_same_weights_smaller(tmp_path):
    """The restart's other half: the checkpoint's plan (micro-batch 8) is cut to the agreed limit (4) when the run
    goes on from it, and the weights match a run that kept 8 (the loss is token-exact for any split; SGD, so
    rounding in near-zero gradients is not amplified as Adam's 1/sqrt(v) does)."""
    spec = dataclasses.replace(SPEC, optimizer="sgd", lr=0.1)
    corpus = SyntheticCorpus(16, seed=0)

    def run(name: str, resume: bool = False, limit: int | None = None, stop_after: int | None = None):
        workload = build_workload(spec, "cpu", seed=0)
        config = TrainConfig(steps=3, seed=0, checkpoint_every=1, run_dir=str(tmp_path / name),
                             micro_batch_limit=limit)

        def on_step(log):
            if stop_after is not None and log.step == stop_after + 1:
                raise KeyboardInterrupt  # the rank dies after the checkpoint of step `stop_after`

        return workload.model, train(workload, make_plan(16, 8), corpus, config, resume=resume, on_step=on_step)

    kept, _ = run("kept")
    with pytest.raises(KeyboardInterrupt):
        run("cut", stop_after=1)
    resumed, result = run("cut", resume=True, limit=4)
    assert result.plan.micro_batch == 4 and result.plan.grad_accum_steps == 4
    assert [(log.step, log.micro_batch) for log in result.logs] == [(2, 4), (3, 4)]
    for (name, a), b in zip(kept.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert_close_at_scale(b, a, msg=name)
