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
    assert {"noise_scale", "grad_sq", "grad_var"} <= set(rows[0]) and all(row["noise_scale"] for row in rows)
    whole, _ = logged_noise_scale(64, 64, steps=2)  # a step of one micro-batch has no small batch to compare
    assert whole == [None, None]


def test_on_uneven_padded_causal_lm_micro_batches_the_measurement_is_that_of_per_sample_gradients():
    """Hooks and rescaling against explicit per-sample gradients (one backward per sample) of a tiny GPT-2: the
    micro-batches' own mean gradients over their targets, and the step's, give the same |G|^2 and tr(S)."""
    from gaplan.data import SyntheticCorpus, collate
    from gaplan.training.noise_scale import NoiseScaleMeter
    from gaplan.training.step import accumulate_gradients
    from gaplan.workload.loss import count_targets, summed_token_loss

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=32)
    workload = build_workload(spec, "cpu", seed=0)
    model, task = workload.model, workload.task
    corpus = SyntheticCorpus(32, seed=0)
    samples = [corpus[i] for i in range(12)]
    splits = [(0, 3), (3, 8), (8, 12)]  # 3, 5 and 4 samples of 8 to 32 tokens: uneven, each padded its own way
    meter = NoiseScaleMeter(model)
    accumulate_gradients(model, [collate(samples[a:b], task) for a, b in splits], workload.raw_loss, task,
                         noise=meter)
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
    means = [sum(sums[a:b]) / sum(targets[a:b]) for a, b in splits]
    sizes = [sum(targets[a:b]) for a, b in splits]
    big = sum(sums) / sum(targets)
    small_sq = sum(n * m.pow(2).sum() for n, m in zip(sizes, means, strict=True)) / sum(sizes)
    b_small, b_big = sum(sizes) / len(sizes), sum(sizes)
    big_sq = big.pow(2).sum()
    expected_sq = float((b_big * big_sq - b_small * small_sq) / (b_big - b_small))
    expected_var = float((small_sq - big_sq) / (1 / b_small - 1 / b_big))
    assert reading.small_batch == b_small and reading.big_batch == b_big
    assert abs(reading.grad_sq - expected_sq) / abs(expected_sq) < 0.05
    assert abs(reading.grad_var - expected_var) / abs(expected_var) < 0.05


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ddp_ranks_log_the_noise_scale_one_process_logs(tmp_path):
    """The same step of 32 samples as 8 micro-batches of 4, in one process and over 2 ranks (gloo): the logged
    columns agree to 1e-5 (the norms are summed over the ranks, the big gradient is the reduced one)."""
    import csv
    import os
    import subprocess
    import sys

    from tests.conftest import free_port

    common = ["-m", "gaplan", "train", "--seq-len", "32", "--micro-batch", "4", "--effective-batch", "32", "--steps",
              "3", "--optimizer", "sgd", "--lr", "1e-12", "--device", "cpu", "--quiet"]
    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"))
    for name, launch in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc-per-node", "2",
                                               "--master-port", str(free_port())])):
        done = subprocess.run([sys.executable, *launch, *common, "--out", str(tmp_path / name)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    def columns(name):
        with open(tmp_path / name / "train_log.csv") as handle:
            return [[float(row[k]) for k in ("noise_scale", "grad_sq", "grad_var")] for row in csv.DictReader(handle)]

    one, two = columns("one"), columns("two")
    assert len(one) == len(two) == 3
    for a, b in zip(one, two, strict=True):
        for x, y in zip(a, b, strict=True):
            assert abs(x - y) <= 1e-5 * abs(x), (one, two)
