"""Gradient equivalence: accumulation over (uneven) micro-batches equals one big batch, exactly."""

import re

import pytest
import torch

from gaplan.core.tasks import CAUSAL_LM, CLASSIFICATION, IGNORE_INDEX, MASKED_LM, SEQ2SEQ_LM
from gaplan.data import SyntheticCorpus, collate
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import WorkloadSpec, build_workload
from gaplan.workload.loss import count_targets
from tests.tolerances import assert_close_at_scale, relative_difference

MAX_DIFF: dict[str, float] = {}  # filled as the tests run; printed by `pytest -s -k report` users


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()


def step_gradient(workload, batches, loss_is_scaled_for_ga=None, raw_loss=None):
    workload.model.zero_grad(set_to_none=True)
    accumulate_gradients(workload.model, batches, raw_loss or workload.raw_loss, workload.task,
                         loss_is_scaled_for_ga)
    return grads(workload.model)


def padded_batches(task, sizes, seq_len=24, seed=0):
    corpus = SyntheticCorpus(seq_len, num_labels=4, seed=seed, target_len=12 if task == SEQ2SEQ_LM else None)
    samples = [corpus[i] for i in range(sum(sizes))]
    whole = collate(samples, task)
    parts, offset = [], 0
    for size in sizes:
        parts.append(collate(samples[offset:offset + size], task))
        offset += size
    return whole, parts


def assert_equivalent(big, accumulated, name):
    MAX_DIFF[name] = relative_difference(accumulated, big)
    assert_close_at_scale(accumulated, big)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    built = {}
    for name, seq in (("tiny-gpt2", 24), ("tiny-bert-mlm", 24), ("tiny-bert-cls", 24), ("tiny-t5", 24)):
        workload = build_workload(WorkloadSpec(model=name, seq_len=seq, optimizer="sgd"), "cpu")
        workload.model.eval()  # no dropout: the same function on both sides
        built[workload.task] = workload
    return built


@pytest.mark.parametrize("task", [CAUSAL_LM, MASKED_LM, CLASSIFICATION, SEQ2SEQ_LM])
@pytest.mark.parametrize("sizes", [(4, 4, 4, 4), (6, 5, 5), (9, 7)])
def test_accumulation_equals_big_batch(models, task, sizes):
    workload = models[task]
    whole, parts = padded_batches(task, sizes)
    big = step_gradient(workload, [whole])
    assert_equivalent(big, step_gradient(workload, parts), f"{task} {sizes}")


def test_shift_labels(models):
    workload = models[CAUSAL_LM]
    whole, parts = padded_batches(CAUSAL_LM, (5, 3, 2))

    def with_shift(batch):
        labels = batch.pop("labels")
        shifted = torch.full_like(labels, IGNORE_INDEX)
        shifted[:, :-1] = labels[:, 1:]
        return {**batch, "shift_labels": shifted}

    whole, parts = with_shift(whole), [with_shift(p) for p in parts]
    assert count_targets(whole, CAUSAL_LM) == sum(count_targets(p, CAUSAL_LM) for p in parts)
    assert_equivalent(step_gradient(workload, [whole]), step_gradient(workload, parts), "shift_labels")


def test_causal_loss_is_transformers_own_loss_summed(models):
    """The summed token loss is the model's own mean loss times the targets gaplan counts (same shift)."""
    from gaplan.workload.loss import summed_token_loss

    workload = models[CAUSAL_LM]
    whole, _ = padded_batches(CAUSAL_LM, (7,))
    with torch.no_grad():
        output = workload.model(**whole)
        summed = summed_token_loss(output.logits, whole, CAUSAL_LM)
    torch.testing.assert_close(summed / count_targets(whole, CAUSAL_LM), output.loss, rtol=1e-6, atol=0)


def test_seq2seq_loss_is_the_models_own_loss_summed_over_decoder_targets(models, tmp_path):
    """T5's and BART's own loss (labels given, the model shifting them itself) is gaplan's summed loss over the
    targets (-100 padding excluded) divided by their count: the same decoder inputs, the same targets."""

    from ..model_folders import make_bart_folder

    bart = build_workload(WorkloadSpec(model=make_bart_folder(str(tmp_path / "bart"), vocab_size=256), seq_len=24),
                          "cpu")
    bart.model.eval()
    for workload in (models[SEQ2SEQ_LM], bart):
        whole, _ = padded_batches(SEQ2SEQ_LM, (7,))
        assert (whole["labels"] == IGNORE_INDEX).any()  # uneven targets: padding is in the batch
        with torch.no_grad():
            own = workload.model(**whole).loss
            summed = workload.raw_loss(workload.model, whole)
        torch.testing.assert_close(summed / count_targets(whole, SEQ2SEQ_LM), own, rtol=1e-5, atol=0)
        assert count_targets(whole, SEQ2SEQ_LM) == int((whole["labels"] != IGNORE_INDEX).sum())
    assert bart.task == SEQ2SEQ_LM and bart.info["target_len"] == 12  # from is_encoder_decoder; half the source


def test_causal_count_skips_position_zero():
    batch = {"labels": torch.tensor([[5, 6, IGNORE_INDEX], [7, 8, 9]])}
    assert count_targets(batch, CAUSAL_LM) == 3  # [6] and [8, 9]
    assert count_targets(batch, MASKED_LM) == 5


def test_custom_loss_hook_both_ways(models):
    workload = models[CAUSAL_LM]
    whole, parts = padded_batches(CAUSAL_LM, (6, 5, 5))  # even sizes: a mean loss is exact only then
    from gaplan.workload.loss import summed_token_loss

    def scaled_loss(model, batch):  # declares loss_is_scaled_for_ga=True: divides by the step's count itself
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return summed_token_loss(logits, batch, CAUSAL_LM) / batch["num_items_in_batch"]

    big = step_gradient(workload, [whole])
    assert_equivalent(big, step_gradient(workload, parts, True, scaled_loss), "custom scaled_for_ga=True")

    def per_sample_mean(model, batch):  # declares False: a per-batch mean, divided by the accumulation steps
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        per_sample = torch.stack([summed_token_loss(logits[i:i + 1], {"labels": batch["labels"][i:i + 1]},
                                                    CAUSAL_LM) for i in range(len(logits))])
        return per_sample.mean()

    equal_parts = [collate([SyntheticCorpus(24)[i] for i in range(j, j + 4)], CAUSAL_LM) for j in (0, 4, 8, 12)]
    whole16 = collate([SyntheticCorpus(24)[i] for i in range(16)], CAUSAL_LM)
    big = step_gradient(workload, [whole16], False, per_sample_mean)
    assert_equivalent(big, step_gradient(workload, equal_parts, False, per_sample_mean), "custom scaled_for_ga=False")


def test_naive_mean_of_means_fails_the_same_check(models):
    workload = models[CAUSAL_LM]
    whole, parts = padded_batches(CAUSAL_LM, (6, 5, 5))
    big = step_gradient(workload, [whole])

    def mean_loss(model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        from gaplan.workload.loss import summed_token_loss

        return summed_token_loss(logits, batch, CAUSAL_LM) / count_targets(batch, CAUSAL_LM)

    naive = step_gradient(workload, parts, False, mean_loss)  # mean per micro-batch, / accumulation steps
    with pytest.raises(AssertionError):
        assert_close_at_scale(naive, big)
    assert relative_difference(naive, big) > 1e-2  # not a rounding difference: the loss is wrong



@pytest.mark.parametrize("loss, items, message", [
    (lambda model, batch: model(batch["x"]), 2, "must return a scalar tensor, one number to backpropagate (got a tensor "
                                                "of shape (2, 1))"),
    (lambda model, batch: 1.0, 2, "must return a scalar tensor, one number to backpropagate (got a float)"),
    (lambda model, batch: model(batch["x"]).sum(), -5, "num_items_in_batch is the step's target count, 0 or more"),
])
def test_a_callers_loss_or_count_that_cannot_be_used_is_one_line(loss, items, message):
    from gaplan.core.errors import GaplanError

    model = torch.nn.Linear(4, 1)
    with pytest.raises(GaplanError, match=re.escape(message)):
        accumulate_gradients(model, [{"x": torch.randn(2, 4)}], loss, CAUSAL_LM, num_items_in_batch=items)


def test_a_batch_without_labels_is_one_line():
    from gaplan.core.errors import GaplanError

    with pytest.raises(GaplanError, match="a micro-batch has no 'labels': the causal-lm loss counts its targets"):
        accumulate_gradients(torch.nn.Linear(4, 1), [{"x": torch.randn(2, 4)}],
                             lambda model, batch: model(batch["x"]).sum(), CAUSAL_LM)
