"""The gradient noise scale measured during accumulation: against a closed form, the same for any split of the
step, on uneven padded causal-LM micro-batches against per-sample gradients, and absent where it cannot be made."""

import pytest
import torch

from gaplan.plan.split import make_plan
from gaplan.training.config import TrainConfig
from gaplan.training.loop import train
from gaplan.workload.build import WorkloadSpec, build_workload
from tests.training import linear_regression

LINEAR = WorkloadSpec(model="tests.training.linear_regression:make", optimizer="sgd", lr=1e-12)  # the weights stay


def logged_noise_scale(micro_batch, effective, steps=120, tmp_path=None):
    workload = build_workload(LINEAR, "cpu", seed=0)
    result = train(workload, make_plan(effective, micro_batch), None,
                   TrainConfig(steps=steps, seed=0, run_dir=str(tmp_path) if tmp_path else None))
    return [log.noise_scale for log in result.logs], result


@pytest.mark.parametrize("micro_batch", [8, 32])
def test_the_logged_noise_scale_of_linear_regression_is_its_closed_form(micro_batch, tmp_path):
    """8 x 32 and 32 x 8 (the same effective batch of 256): each within 10% of tr(S) / |G|^2 = 17."""
    scales, _ = logged_noise_scale(micro_batch, 256, tmp_path=tmp_path)
    expected = linear_regression.noise_scale()
    assert expected == 17.0
    assert abs(scales[-1] - expected) / expected < 0.10, (micro_batch, scales[-1])


def test_the_log_has_the_columns_and_one_micro_step_measures_nothing(tmp_path):
    import csv

    _, result = logged_noise_scale(8, 64, steps=3, tmp_path=tmp_path)
    with open(tmp_path / "train_log.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {"noise_scale", "grad_sq", "grad_var", "noise_scale_items"} <= set(rows[0])
    assert all(row["noise_scale"] for row in rows)
    # Samples here have one item each: the two units agree.
    assert all(float(row["noise_scale"]) == pytest.approx(float(row["noise_scale_items"]), rel=1e-12) for row in rows)
    whole, _ = logged_noise_scale(64, 64, steps=2)  # a step of one micro-batch has no small batch to compare
    assert whole == [None, None]


def _per_sample_check(mean_loss):
    """One step of a tiny GPT-2 on padded micro-batches of 3, 5 and 4 samples (8 to 32 tokens: uneven targets),
    measured by the meter, and the same estimates from explicit per-sample gradients (one backward per sample)."""
    from gaplan.data import SyntheticCorpus, collate
    from gaplan.training.noise_scale import NoiseScaleMeter
    from gaplan.training.step import accumulate_gradients
    from gaplan.workload.loss import count_targets, summed_token_loss
    from tests.scripts.noise_by_hand import solve_two_batch

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=32)
    workload = build_workload(spec, "cpu", seed=0)
    model, task = workload.model.double(), workload.task  # float64: the identity, not fp32's rounding, is tested
    corpus = SyntheticCorpus(32, seed=0)
    samples = [corpus[i] for i in range(12)]
    splits = [(0, 3), (3, 8), (8, 12)]  # 3, 5 and 4 samples of 8 to 32 tokens: uneven, each padded its own way

    def mean_loss_of(module, batch):  # a custom per-batch mean: the mean-loss path
        return workload.raw_loss(module, batch) / count_targets(batch, task)

    meter = NoiseScaleMeter(model)
    accumulate_gradients(model, [collate(samples[a:b], task) for a, b in splits],
                         mean_loss_of if mean_loss else workload.raw_loss, task,
                         loss_is_scaled_for_ga=False if mean_loss else None, noise=meter)
    reading = meter.finish(len(samples))
    meter.close()

    def flat_gradient(batch):
        model.zero_grad(set_to_none=True)
        summed_token_loss(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch,
                          task).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()]).double()

    singles = [collate([s], task) for s in samples]
    sums = [flat_gradient(one) for one in singles]  # each sample's gradient of its summed token loss
    targets = [count_targets(one, task) for one in singles]
    sizes = [sum(targets[a:b]) for a, b in splits]
    means = [sum(sums[a:b]) / n for (a, b), n in zip(splits, sizes, strict=True)]
    weights = [1 / len(sizes)] * len(sizes) if mean_loss else [n / sum(sizes) for n in sizes]
    return reading, sizes, solve_two_batch(means, sizes, weights)


def test_on_uneven_padded_causal_lm_micro_batches_the_measurement_is_that_of_per_sample_gradients():
    """The token-exact loss: the meter's |G|^2 and tr(S) are the per-sample gradients' to 1e-5 (an identity: only
    float rounding differs), B_small the mean micro-batch and B_big the step's targets."""
    reading, sizes, (expected_sq, expected_var) = _per_sample_check(mean_loss=False)
    assert len(set(sizes)) == 3
    assert reading.small_batch == pytest.approx(sum(sizes) / 3, rel=1e-12)
    assert reading.big_batch == pytest.approx(sum(sizes), rel=1e-12)
    assert reading.grad_sq == pytest.approx(expected_sq, rel=1e-5)
    assert reading.grad_var == pytest.approx(expected_var, rel=1e-5)


def test_a_per_batch_mean_loss_is_measured_as_the_mean_of_the_micro_batch_means_it_trains():
    """A per-batch mean divided by the steps: .grad is the plain mean of the micro-batches' means, whose variance
    is that of K^2 / sum(1/n) targets, not sum(n): the meter agrees with the per-sample gradients to 1e-5."""
    reading, sizes, (expected_sq, expected_var) = _per_sample_check(mean_loss=True)
    assert reading.big_batch == pytest.approx(9 / sum(1 / n for n in sizes), rel=1e-12)
    assert reading.big_batch < sum(sizes)
    assert reading.grad_sq == pytest.approx(expected_sq, rel=1e-5)
    assert reading.grad_var == pytest.approx(expected_var, rel=1e-5)


@pytest.mark.parametrize("mean_loss", [True, False])
def test_on_uneven_micro_batches_both_loss_paths_are_unbiased(mean_loss):
    """Linear regression at known |G|^2 = 1 and tr(S) = 17, 1000 independent steps of micro-batches of 4, 28, 8
    and 24 samples, unsmoothed: the average estimates are within 4 standard errors (and 12%) of the truth on the
    per-batch-mean loss and on the summed one."""
    from gaplan.training.noise_scale import NoiseScaleMeter
    from gaplan.training.step import accumulate_gradients

    torch.manual_seed(0)
    workload = linear_regression.make()
    model, sizes = workload.model, [4, 28, 8, 24]

    def summed(module, batch):
        return workload.loss(module, batch) * batch["x"].shape[0]

    meter = NoiseScaleMeter(model, smoothing=0.0)  # each reading is its own step's estimate
    readings = []
    for _ in range(1000):
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, [workload.make_batch(n) for n in sizes], workload.loss if mean_loss else summed,
                             "custom", loss_is_scaled_for_ga=False if mean_loss else None, noise=meter)
        readings.append(meter.finish(sum(sizes)))
    meter.close()
    grad_var_truth = linear_regression.noise_scale()  # tr(S) at |G|^2 = 1
    for values, truth in (([r.grad_sq for r in readings], 1.0), ([r.grad_var for r in readings], grad_var_truth)):
        values = torch.tensor(values, dtype=torch.float64)
        mean, error = float(values.mean()), float(values.std() / len(values) ** 0.5)
        assert abs(mean - truth) < 4 * error and abs(mean - truth) < 0.12 * truth, (mean_loss, mean, error, truth)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_two_ddp_ranks_log_the_noise_scale_one_process_logs(tmp_path):
    """The same step of 32 samples as 8 micro-batches of 4, in one process and over 2 ranks (gloo): the logged
    columns agree to 1e-5 (the norms are summed over the ranks, the big gradient is the reduced one)."""
    from tests.conftest import train_logs_of_one_process_and_two_ranks

    logs = train_logs_of_one_process_and_two_ranks(tmp_path, [
        "--seq-len", "32", "--micro-batch", "4", "--effective-batch", "32", "--steps", "3", "--optimizer", "sgd",
        "--lr", "1e-12", "--device", "cpu", "--quiet"])
    one, two = ([[float(row[k]) for k in ("noise_scale", "grad_sq", "grad_var")] for row in log] for log in logs)
    assert len(one) == len(two) == 3
    for a, b in zip(one, two, strict=True):
        for x, y in zip(a, b, strict=True):
            assert abs(x - y) <= 1e-5 * abs(x), (one, two)
