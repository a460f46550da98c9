"""gaplan with Lightning: GaplanBatchSize probes the LightningModule's own step and sets the batch size and the
accumulation for a fixed effective batch; TokenExactLoss makes the step's gradient that of one full batch."""

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

from gaplan import GaplanError  # noqa: E402
from gaplan.data import SyntheticCorpus, collate  # noqa: E402
from gaplan.integrations.lightning import GaplanBatchSize  # noqa: E402
from gaplan.integrations.lightning_loss import TokenExactLoss  # noqa: E402
from gaplan.workload.loss import summed_token_loss  # noqa: E402
from tests.conftest import REPO_ROOT, SMALL_BUDGET, free_port  # noqa: E402
from tests.scripts.lightning_gpt import TASK, GptModule, quiet_trainer, tiny_gpt  # noqa: E402
from tests.scripts.noise_by_hand import estimates_by_hand  # noqa: E402

SCRIPTS = os.path.join(REPO_ROOT, "tests", "scripts")


def full_batch_gradient(samples, positions):
    reference = tiny_gpt(positions=positions)
    whole = collate(samples, TASK)
    targets = (whole["labels"][:, 1:] != -100).sum()
    (summed_token_loss(reference(**whole).logits, whole, TASK) / targets).backward()
    return {name: p.grad for name, p in reference.named_parameters()}


def worst_relative_difference(got, expected):
    return max(((got[n] - g).abs().max() / g.abs().max()).item() for n, g in expected.items())


def test_token_exact_loss_gives_the_gradient_of_one_full_batch_on_padded_uneven_micro_batches():
    # 11 samples of 8 to 32 tokens as 4 + 4 + 3: every micro-batch pads, and differently
    module = GptModule(batch_size=4, samples=11, seq_len=32, fixed_length=False, optimizer="sgd", lr=0.0)
    quiet_trainer(max_steps=1, accumulate_grad_batches=3, callbacks=[TokenExactLoss(TASK)]).fit(module)
    corpus = SyntheticCorpus(32, seed=0)
    expected = full_batch_gradient([corpus[i] for i in range(11)], 32)
    assert len(module.step_grads) == 1
    for name, grad in expected.items():
        torch.testing.assert_close(module.step_grads[0][name], grad, rtol=1e-5, atol=1e-7, msg=name)

    # The mean loss per micro-batch Lightning users write (divided by the steps by Lightning) is not that gradient.
    naive = GptModule(batch_size=4, samples=11, seq_len=32, fixed_length=False, optimizer="sgd", lr=0.0, summed=False)
    quiet_trainer(max_steps=1, accumulate_grad_batches=3).fit(naive)
    assert worst_relative_difference(naive.step_grads[0], expected) > 1e-3


def test_token_exact_loss_measures_the_noise_scale_of_a_step_as_computed_by_hand():
    """The 4 + 4 + 3 padded step above: the reading is the two-batch estimate from each micro-batch's own mean
    gradient (weighted by targets) and the step's gradient, before Lightning clips (gradient_clip_val 1e-3), to 1e-5
    in float64 (the identity is tested, not fp32's rounding, which the estimator's cancellation magnifies)."""
    module = GptModule(batch_size=4, samples=11, seq_len=32, fixed_length=False, optimizer="sgd", lr=0.0)
    callback = TokenExactLoss(TASK)
    trainer = quiet_trainer(max_steps=1, accumulate_grad_batches=3, gradient_clip_val=1e-3, callbacks=[callback],
                            precision="64-true")
    trainer.fit(module)
    corpus = SyntheticCorpus(32, seed=0)
    samples = [corpus[i] for i in range(11)]
    reference = tiny_gpt(positions=32).double()

    def gradient(batches, denominator):
        reference.zero_grad()
        for batch in batches:
            (summed_token_loss(reference(**batch).logits, batch, TASK) / denominator).backward()
        return torch.cat([p.grad.flatten() for p in reference.parameters()])

    micro = [collate(samples[:4], TASK), collate(samples[4:8], TASK), collate(samples[8:], TASK)]
    grad_sq, grad_var = estimates_by_hand(gradient, micro, TASK)
    reading = callback.reading
    assert reading.grad_sq == pytest.approx(grad_sq, rel=1e-5) and reading.grad_var == pytest.approx(grad_var, rel=1e-5)
    targets = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro)
    assert reading.noise_scale == pytest.approx(grad_var / grad_sq / (targets / 11), rel=1e-5)
    assert float(trainer.callback_metrics["noise_scale"]) == pytest.approx(reading.noise_scale, rel=1e-5)
    assert callback.meter is None  # its hooks are gone after fit

    off = TokenExactLoss(TASK, noise_scale=False)
    quiet_trainer(max_steps=1, accumulate_grad_batches=3, callbacks=[off]).fit(
        GptModule(batch_size=4, samples=11, seq_len=32, fixed_length=False, optimizer="sgd", lr=0.0))
    assert off.reading is None


def fresh_process(*options):
    """``tests/scripts/lightning_gpt.py`` in a new process: a user's training script."""
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "lightning_gpt.py"), *map(str, options)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy
@pytest.mark.slow
def test_fit_trains_at_the_probed_edge_with_the_effective_batch_kept_and_one_more_sample_fails_in_a_fresh_fit():
    # The budget is set half a sample above the edge of a first probe, from its memory line: a fresh process's
    # allocations differ from a trial's by up to ~1 MiB of heap layout, and the test must not hang on that.
    first = fresh_process("--probe", 64, "--budget", SMALL_BUDGET)
    fits = sorted((t["micro_batch"], t["peak_bytes"]) for t in first["trials"] if t["fits"])
    (small, low), (edge, high) = fits[0], fits[-1]
    assert edge == first["edge"]
    budget = high + (high - low) // (edge - small) // 2

    effective = 2 * edge
    probed = fresh_process("--probe", effective, "--budget", budget)
    assert probed["edge"] == edge
    assert (probed["batch_size"], probed["accumulate"], probed["loader_batch_size"]) == (edge, 2, edge)
    assert probed["global_step"] == 2
    assert any(not t["fits"] and t["micro_batch"] == edge + 1 for t in probed["trials"])

    assert fresh_process("--batch", edge, "--accumulate", 2, "--budget", budget)["fits"]
    assert not fresh_process("--batch", edge + 1, "--accumulate", 2, "--budget", budget)["fits"]


@contextlib.contextmanager
def lightning_log():
    """The lines of Lightning's ``rank_zero_info``, which a script shows by default (the test below)."""
    import logging

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    loggers = [logging.getLogger(name) for name in ("pytorch_lightning", "lightning_fabric")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield lines
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def test_a_script_shows_lightnings_rank_zero_info_by_default():
    """Where GaplanBatchSize says each trial: Lightning sets up a stderr handler at INFO for it on import (pytest's
    own handlers stop that here, so a script of its own shows it)."""
    done = subprocess.run([sys.executable, "-c", "from pytorch_lightning.utilities.rank_zero import rank_zero_info\n"
                           "rank_zero_info('GaplanBatchSize: shown')"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "GaplanBatchSize: shown" in done.stderr, done.stderr


def test_in_a_long_lived_process_the_callback_sets_the_split_of_the_effective_batch():
    """After other fits in this process (its freed heap sealed in each trial); the edge itself is checked above."""
    callback = GaplanBatchSize(48, memory_limit=SMALL_BUDGET // 4, threads=1)
    module = GptModule(samples=96)
    trainer = quiet_trainer(max_steps=1, callbacks=[callback])
    with lightning_log() as lines:
        trainer.fit(module)
    # Each trial and the answer in Lightning's own log, which Lightning shows by default (as BatchSizeFinder's).
    trials = [line for line in lines if line.startswith("GaplanBatchSize:  micro-batch")]
    assert len(trials) == len(callback.result.trials) >= 2, lines
    assert any(line.startswith(f"GaplanBatchSize: the largest micro-batch that fits is {callback.max_micro_batch};")
               for line in lines), lines
    assert callback.plan.micro_batch * trainer.accumulate_grad_batches == 48
    assert module.batch_size == callback.plan.micro_batch <= callback.max_micro_batch < 48
    assert trainer.global_step == 1 and trainer.train_dataloader.batch_size == module.batch_size


class PlanFedModule(GptModule):
    """A module whose train_dataloader takes loader_options: the plan's batch sampler once the probe has run."""

    def train_dataloader(self):
        from torch.utils.data import DataLoader

        from gaplan.integrations.lightning import loader_options

        corpus = SyntheticCorpus(self.seq_len, seed=0)
        samples = [corpus[i] for i in range(self.samples)]
        return DataLoader(samples, collate_fn=lambda s: collate(s, TASK),
                          **loader_options(self.trainer, len(samples), self.batch_size))


@pytest.mark.slow
def test_uneven_true_trains_the_plan_at_b_star_exactly_and_the_default_says_what_its_even_split_gives_up():
    """11 padded samples at B* 4 (the search capped there): uneven=True trains 4,4,3 and the step's gradient is the
    11 as one batch; the default trains 1 x 11 (11 is prime) and warns once, naming 8 or 12 as batches that split
    evenly at 4."""
    options = dict(memory_limit=SMALL_BUDGET // 4, threads=1, search_cap=4)
    callback = GaplanBatchSize(11, uneven=True, **options)
    module = PlanFedModule(batch_size=1, samples=11, seq_len=32, fixed_length=False, optimizer="sgd", lr=0.0)
    loss = TokenExactLoss(TASK)
    trainer = quiet_trainer(max_steps=1, callbacks=[callback, loss])
    trainer.fit(module)
    # The plan's sampler draws each step from one epoch's permutation: the noise reading is corrected for it.
    assert loss.reading is not None and loss.reading.drawing == "epochs"
    assert callback.max_micro_batch == 4 and callback.plan.micro_batch_sizes == (4, 4, 3)
    assert callback.result.split == callback.result.plan == callback.plan and trainer.accumulate_grad_batches == 3
    corpus = SyntheticCorpus(32, seed=0)
    expected = full_batch_gradient([corpus[i] for i in range(11)], 32)
    assert len(module.step_grads) == 1
    assert worst_relative_difference(module.step_grads[0], expected) < 1e-5

    even = GaplanBatchSize(11, **options)
    even_loss = TokenExactLoss(TASK)
    with pytest.warns(UserWarning, match=r"4,4,3, but a DataLoader with one batch_size.*1 x 11.*8 or 12"):
        quiet_trainer(max_steps=1, callbacks=[even, even_loss]).fit(
            GptModule(batch_size=1, samples=11, seq_len=32, fixed_length=False, optimizer="sgd", lr=0.0))
    assert even.plan.micro_batch == 1 and even.result.plan.micro_batch == 4 and not even.result.uses_plan
    assert even_loss.reading is not None and even_loss.reading.drawing == "unknown"  # the loader's order: not drawn

    # uneven=True with a loader of one batch_size (no loader_options) would train 4 x 3 = 12 a step, not 11: refused
    plain = GaplanBatchSize(11, uneven=True, **options)
    with pytest.raises(GaplanError, match=r"only through loader_options .* a step would train 12 samples, not 11"):
        quiet_trainer(max_steps=1, callbacks=[plain, TokenExactLoss(TASK)]).fit(
            GptModule(batch_size=1, samples=11, seq_len=32, fixed_length=False, optimizer="sgd", lr=0.0))


@pytest.mark.heavy
@pytest.mark.slow
def test_where_the_trainer_cannot_fork_the_trials_are_spawned_with_the_module_pickled():
    """The CUDA path (Lightning sets the card before any callback runs, so its process cannot fork), run on CPU:
    each trial is a new interpreter that gets the module, the precision plugin and the largest samples pickled."""
    trials = []
    callback = GaplanBatchSize(8, memory_limit=SMALL_BUDGET // 4, threads=1, start="spawn", on_trial=trials.append)
    module = GptModule(samples=32)
    trainer = quiet_trainer(max_steps=1, callbacks=[callback])
    trainer.fit(module)
    assert callback.result.spawned and trials and all(t.fits and t.peak_bytes > 0 for t in trials)
    assert callback.plan.micro_batch * trainer.accumulate_grad_batches == 8 and trainer.global_step == 1
    with pytest.raises(GaplanError, match="make_batch must be picklable there"):
        quiet_trainer(max_steps=1, callbacks=[GaplanBatchSize(8, start="spawn", make_batch=lambda b: None)]).fit(
            GptModule(samples=32))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.heavy
def test_under_two_ddp_ranks_every_rank_takes_the_smallest_edge_and_the_step_is_one_full_batch():
    """torchrun, 2 CPU ranks (gloo): rank 1 has the smaller budget; both train at its edge, the effective batch kept,
    and the synced gradient of the first step is that of its samples of both ranks as one batch. The loader's
    drawing is read as an epoch's permutation (DDP's shuffling sampler); the reading is compared with the hand's
    independent-draws estimate with the meter set to independent draws after that read (the finite correction has its
    own tests; since issue 58 the reading applied it, and this comparison did not)."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), os.path.join(SCRIPTS, "lightning_ddp.py")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["edges"][1] < result["edges"][0] and result["agreed"] == [result["edges"][1]] * 2
    assert result["micro_batch"] * result["accumulate"] * 2 == result["effective_batch"]
    assert result["micro_batch"] <= result["edges"][1] and result["global_step"] == 1
    assert result["samples"] == 64 and result["worst"] < 1e-5, result
    # The noise scale: one reading for the step on both ranks (its sums in one collective), and it is the estimate
    # of all ranks' micro-batches as the small batches of the one step, computed by hand.
    assert result["micro_batches"] == 2 * result["accumulate"] >= 2
    assert result["drawing"] == ["epochs", 4 * result["effective_batch"]]  # DDP's sampler, read as drawn per epoch
    (sq0, var0), (sq1, var1) = result["noise"]
    assert (sq0, var0) == pytest.approx((sq1, var1), rel=1e-9)
    assert sq0 == pytest.approx(result["noise_by_hand"][0], rel=1e-4)
    assert var0 == pytest.approx(result["noise_by_hand"][1], rel=1e-4)


class ManualModule(GptModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


class NoBatchField(GptModule):
    def __init__(self):
        super().__init__()
        del self.batch_size


@pytest.mark.parametrize("module, fit_loader, message", [
    (ManualModule, False, "automatic optimization"),
    (NoBatchField, False, "no field 'batch_size'"),
    (GptModule, True, "dataloaders passed to fit"),
])
def test_what_the_callback_cannot_do_is_one_line_before_any_trial(module, fit_loader, message):
    trials = []
    trainer = quiet_trainer(max_steps=1, callbacks=[GaplanBatchSize(8, on_trial=trials.append)])
    instance = module()
    loader = instance.train_dataloader() if fit_loader else None
    with pytest.raises(GaplanError, match=message) as caught:
        trainer.fit(instance, train_dataloaders=loader)
    assert "\n" not in str(caught.value) and trials == []


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_a_bad_effective_batch_is_refused_at_once(bad):
    with pytest.raises(GaplanError, match="effective_batch must be a positive integer"):
        GaplanBatchSize(bad)


def test_a_scan_of_no_samples_is_refused_where_it_is_given():
    """scan=0 read no sample, and the callback then said the training set was empty."""
    from gaplan import GaplanError
    from gaplan.integrations.lightning import GaplanBatchSize

    with pytest.raises(GaplanError, match="scan is how many training samples to read for the longest, 1 or more"):
        GaplanBatchSize(96, "256MiB", scan=0)
