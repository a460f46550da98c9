"""GaplanTrainer, honest: transformers' own gradient-accumulation tests, adapted offline, run with both Trainers;
``compute_loss_func`` and ``model_accepts_loss_kwargs`` followed as the Trainer follows them; exact eval loss.

Adapted from transformers' ``tests/trainer/test_trainer.py`` ("gradient_accumulation_loss_alignment_with_model_loss"
and "..._with_loss_func"): there a pretrained TinyLlama on wikitext; here a tiny GPT-2 built from its config, first
taught a pattern so that short easy samples and long hard ones have very different losses (what makes a per-batch
mean differ from the token-weighted one), and a stream of padded samples in a fixed order.
"""

from __future__ import annotations

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.core.tasks import IGNORE_INDEX
from gaplan.workload.loss import count_step_targets
from tests.scripts.noise_by_hand import estimates_by_hand
from tests.scripts.trainer_steps import record_micro_batch_sizes, worst_update_difference

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB, LENGTH, SEED = 64, 16, 42


def _model():
    torch.manual_seed(SEED)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    # Teach it "1 follows 1": easy samples then cost little and hard (random) ones a lot.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ones = torch.ones(8, LENGTH, dtype=torch.long)
    for _ in range(30):
        model(input_ids=ones, labels=ones).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def _samples(count: int) -> list[dict]:
    """Alternating blocks of 4 short easy samples and 4 full-length random ones (different target counts)."""
    generator = torch.Generator().manual_seed(SEED)
    samples = []
    for index in range(count):
        if (index // 4) % 2 == 0:
            ids = torch.ones(3, dtype=torch.long)
        else:
            ids = torch.randint(2, VOCAB, (LENGTH,), generator=generator)
        samples.append({"input_ids": ids})
    return samples


class _Stream(torch.utils.data.IterableDataset):
    """The samples in their order (no shuffling), so every run sees the same micro-batches."""

    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        return iter(self.samples)


def _collate(samples):
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        mask[row, : len(sample["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class _Losses(transformers.TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


def _args(tmp_path, **kwargs):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
                    logging_steps=1, max_steps=5, learning_rate=3e-4, seed=SEED, remove_unused_columns=False,
                    dataloader_pin_memory=False)
    return transformers.TrainingArguments(**{**settings, **kwargs})


def _trainer_class(name):
    if name == "Trainer":
        return transformers.Trainer
    from gaplan.integrations.transformers import GaplanTrainer

    return GaplanTrainer


def _losses(tmp_path, cls, *, broken=False, **kwargs):
    losses = _Losses()
    trainer = cls(_model(), _args(tmp_path, **{k: v for k, v in kwargs.items() if k != "compute_loss_func"}),
                  train_dataset=_Stream(_samples(80)), data_collator=_collate, callbacks=[losses],
                  compute_loss_func=kwargs.get("compute_loss_func"))
    if broken:
        # as transformers' test: num_items_in_batch is not passed, the loss is each micro-batch's mean
        trainer.model_accepts_loss_kwargs = False
    trainer.train()
    assert len(losses.losses) == 5
    return losses.losses


def _diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Trainer", "GaplanTrainer"])
def test_gradient_accumulation_loss_alignment_with_model_loss(tmp_path, name):
    cls = _trainer_class(name)
    base = _losses(tmp_path / "base", cls, per_device_train_batch_size=8, gradient_accumulation_steps=1)
    accumulated = _losses(tmp_path / "ga", cls, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    broken = _losses(tmp_path / "broken", cls, broken=True, per_device_train_batch_size=4,
                     gradient_accumulation_steps=2)
    assert _diff(base, accumulated) < 0.01
    assert _diff(base, broken) > 0.5  # the mean of the micro-batches' means is far from the step's loss


def _causal_loss_func(disable_num_items=False):
    """transformers' ForCausalLMLoss, as the test's ``compute_loss``: shifted, summed, over num_items_in_batch."""
    seen = []

    def loss_func(outputs, labels, num_items_in_batch=None):
        seen.append(num_items_in_batch)
        logits = outputs["logits"][..., :-1, :].float()
        targets = labels[..., 1:]
        if disable_num_items or num_items_in_batch is None:
            return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                                                     ignore_index=IGNORE_INDEX)
        summed = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                                                   ignore_index=IGNORE_INDEX, reduction="sum")
        return summed / num_items_in_batch

    loss_func.seen = seen
    return loss_func


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Trainer", "GaplanTrainer"])
def test_gradient_accumulation_loss_alignment_with_loss_func(tmp_path, name):
    cls = _trainer_class(name)
    base = _losses(tmp_path / "base", cls, compute_loss_func=_causal_loss_func(), per_device_train_batch_size=8,
                   gradient_accumulation_steps=1)
    accumulated = _losses(tmp_path / "ga", cls, compute_loss_func=_causal_loss_func(), per_device_train_batch_size=4,
                          gradient_accumulation_steps=2)
    broken = _losses(tmp_path / "broken", cls, compute_loss_func=_causal_loss_func(disable_num_items=True),
                     per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert _diff(base, accumulated) < 0.01
    assert _diff(base, broken) > 0.5


@pytest.mark.slow
def test_compute_loss_func_gets_gaplans_count_of_the_whole_step(tmp_path):
    from gaplan.integrations.transformers import GaplanTrainer

    loss_func = _causal_loss_func()
    trainer = GaplanTrainer(_model(), _args(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                            max_steps=1),
                            train_dataset=_Stream(_samples(8)), data_collator=_collate, compute_loss_func=loss_func)
    trainer.train()
    samples = _samples(8)
    expected = count_step_targets([_collate(samples[:4]), _collate(samples[4:])], "causal-lm")
    assert loss_func.seen == [expected, expected]  # both micro-steps: the step's shifted targets, not position 0


@pytest.mark.slow
def test_the_evaluation_loss_is_the_exact_mean_over_shifted_targets(tmp_path):
    from gaplan.integrations.transformers import GaplanTrainer

    samples = _samples(8)
    model = _model()
    batch = _collate(samples)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    exact = float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                                    batch["labels"][:, 1:].reshape(-1), ignore_index=IGNORE_INDEX))
    args = _args(tmp_path, per_device_eval_batch_size=8)
    ours = GaplanTrainer(model, args, eval_dataset=samples, data_collator=_collate).evaluate()["eval_loss"]
    assert ours == pytest.approx(exact, rel=1e-5)


def test_label_smoothing_is_refused_in_one_line(tmp_path):
    from gaplan.integrations.transformers import GaplanTrainer

    with pytest.raises(GaplanError, match="label_smoothing_factor 0.1 is not applied"):
        GaplanTrainer(_model(), _args(tmp_path, label_smoothing_factor=0.1), data_collator=_collate)


class _Logs(transformers.TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs.append(dict(logs))


def _by_hand(model, micro_batches, mean_loss=False):
    from gaplan.workload.loss import summed_token_loss

    def gradient(batches, denominator):
        model.zero_grad()
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            (summed_token_loss(logits, batch, "causal-lm") / denominator).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    return estimates_by_hand(gradient, micro_batches, "causal-lm", mean_loss=mean_loss)


def _logged_noise(tmp_path, mean_loss=False, model_init=False, micro=4):
    """One step of 4 short samples (2 targets each) and 4 long ones (15 each) in micro-batches of ``micro``, in
    float64 (the identity is tested, not fp32's rounding, which the estimator's cancellation magnifies to ~3e-4): the
    log line and the trainer."""
    from gaplan.integrations.transformers import GaplanTrainer

    logs = _Logs()
    model = None if model_init else _model().double()
    trainer = GaplanTrainer(model, _args(tmp_path, per_device_train_batch_size=micro,
                                         gradient_accumulation_steps=8 // micro, max_steps=1, max_grad_norm=1e-3),
                            model_init=(lambda: _model().double()) if model_init else None,
                            train_dataset=_Stream(_samples(8)), data_collator=_collate, callbacks=[logs])
    if mean_loss:
        trainer.model_accepts_loss_kwargs = False  # the Trainer's mean path: each micro-batch's mean / 2 steps
    trainer.train()
    (logged,) = logs.logs
    return logged, trainer


@pytest.mark.slow
def test_gaplan_trainer_logs_the_noise_scale_of_a_step_as_computed_by_hand(tmp_path):
    """The logged |G|^2 and tr(S) are the two-batch estimates from the micro-batches' own mean gradients, weighted by
    targets, and the step's gradient before the Trainer clips it (max_grad_norm 1e-3 here), to 1e-5."""
    from gaplan.integrations.transformers import GaplanTrainer

    samples = _samples(8)
    grad_sq, grad_var = _by_hand(_model().double(), [_collate(samples[:4]), _collate(samples[4:])])
    logged, trainer = _logged_noise(tmp_path)
    assert logged["grad_sq"] == pytest.approx(grad_sq, rel=1e-5)
    assert logged["grad_var"] == pytest.approx(grad_var, rel=1e-5)
    # In samples: per target x the step's targets per sample (68 / 8).
    assert logged["noise_scale"] == pytest.approx(grad_var / grad_sq / (68 / 8), rel=1e-5)
    assert trainer.noise_meter._handles == []  # the hooks are gone after train()

    quiet = _Logs()
    GaplanTrainer(_model(), _args(tmp_path / "off", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                  max_steps=1), train_dataset=_Stream(samples), data_collator=_collate,
                  callbacks=[quiet], noise_scale=False).train()
    assert "noise_scale" not in quiet.logs[0]


def test_the_trainer_says_how_its_sampler_draws_and_a_sampler_it_cannot_read_is_assumed_independent(tmp_path, caplog):
    """The Trainer's default sampler (a shuffle each epoch, without replacement) is read and corrected for, and the
    log says so; the group_by_length strategy's sampler is not read: the reading assumes independent draws, and the log says so
    once, with the dataset's size and the bias a shuffle gives."""
    import logging

    from gaplan.integrations.transformers import GaplanTrainer

    for grouped in (False, True):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            strategy = "group_by_length" if grouped else "random"
            GaplanTrainer(_model(), _args(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                          max_steps=2, train_sampling_strategy=strategy),
                          train_dataset=_samples(8), data_collator=_collate).train()
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("noise scale: ")]
        assert len(said) == 1, said
        if grouped:
            assert "reading assumes independent draws" in said[0] and "1/(1 - B_noise/8)" in said[0], said
        else:
            assert "a permutation of the 8 samples each epoch: corrected" in said[0], said


@pytest.mark.slow
def test_on_the_trainers_mean_loss_path_the_noise_scale_is_that_of_the_mean_of_means(tmp_path):
    """``model_accepts_loss_kwargs=False``: .grad is the plain mean of the four micro-batches' means (4, 4, 30 and 30
    targets), whose variance is that of 4^2 / (2/4 + 2/30) = 28.2 targets, not 68. The reading matches the estimates
    by hand for that gradient to 1e-5 (taking 68 put tr(S) at 0.53x of it)."""
    samples = _samples(8)
    micro = [_collate(samples[i:i + 2]) for i in range(0, 8, 2)]
    grad_sq, grad_var = _by_hand(_model().double(), micro, mean_loss=True)
    logged, trainer = _logged_noise(tmp_path, mean_loss=True, micro=2)
    # (Here the short samples' gradients are nearly zero, not a random draw: |G|^2 comes out negative, so no
    # noise_scale is logged; the reading itself is compared.)
    reading = trainer.noise_meter.last
    assert reading.big_batch == pytest.approx(16 / (2 / 4 + 2 / 30), rel=1e-12)
    assert reading.grad_sq == pytest.approx(grad_sq, rel=1e-5)
    assert reading.grad_var == pytest.approx(grad_var, rel=1e-5)
    assert "noise_scale" not in logged


@pytest.mark.slow
def test_with_model_init_the_meter_hooks_the_model_that_trains(tmp_path):
    """train() replaces the model with model_init's: the meter hooks that one, and logs the same reading."""
    expected, _ = _logged_noise(tmp_path / "given")
    logged, trainer = _logged_noise(tmp_path / "init", model_init=True)
    assert logged["grad_var"] == pytest.approx(expected["grad_var"], rel=1e-9)
    assert trainer.noise_meter.parameters[0] is next(trainer.model.parameters())


def _t5():
    torch.manual_seed(SEED)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(config)


def _pairs(count: int) -> list[dict]:
    """Sources of 6 tokens; targets of 2 and of 12 tokens in turn: micro-batches with very different target counts."""
    generator = torch.Generator().manual_seed(SEED)
    return [{"input_ids": torch.randint(2, VOCAB, (6,), generator=generator),
             "labels": torch.randint(2, VOCAB, (2 if (index // 3) % 2 == 0 else 12,), generator=generator)}
            for index in range(count)]


def _collate_pairs(samples):
    ids = torch.stack([s["input_ids"] for s in samples])
    labels = torch.full((len(samples), max(len(s["labels"]) for s in samples)), IGNORE_INDEX, dtype=torch.long)
    for row, sample in enumerate(samples):
        labels[row, : len(sample["labels"])] = sample["labels"]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _seq2seq_step(tmp_path, micro, steps, broken=False):
    from gaplan.integrations.transformers import GaplanSeq2SeqTrainer

    model = _t5()
    args = transformers.Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True, max_steps=1,
        learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", seed=SEED, remove_unused_columns=False,
        dataloader_pin_memory=False, per_device_train_batch_size=micro, gradient_accumulation_steps=steps,
        max_grad_norm=0.0)
    trainer = GaplanSeq2SeqTrainer(model, args, train_dataset=_Stream(_pairs(6)), data_collator=_collate_pairs,
                                   noise_scale=False)
    if broken:
        trainer.model_accepts_loss_kwargs = False
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    trainer.train()
    return before - torch.cat([p.detach().flatten() for p in model.parameters()])  # lr 1: the step's gradient


def test_gaplan_seq2seq_trainer_steps_as_one_batch_over_uneven_targets(tmp_path):
    """Seq2SeqTrainer's subclass: 3 + 3 samples whose targets are 2 and 12 tokens long train the same SGD step as
    the 6 at once (the loss over the decoder's targets of the whole step); each micro-batch's mean does not."""
    from gaplan.integrations.transformers import GaplanSeq2SeqTrainer, infer_task

    assert issubclass(GaplanSeq2SeqTrainer, transformers.Seq2SeqTrainer) and infer_task(_t5()) == "seq2seq-lm"
    whole = _seq2seq_step(tmp_path / "whole", 6, 1)
    accumulated = _seq2seq_step(tmp_path / "ga", 3, 2)
    means = _seq2seq_step(tmp_path / "means", 3, 2, broken=True)
    scale = whole.abs().max()
    assert (accumulated - whole).abs().max() <= 1e-5 * scale
    assert (means - whole).abs().max() > 0.05 * scale


def test_gaplan_trainer_trains_an_uneven_plan_at_b_star_with_one_large_batchs_sgd_update(tmp_path):
    """GaplanTrainer(plan=...) feeds the plan 4,4,3 (B* 4 for 11 samples, no divisor traded) through its own loader;
    on padded samples of different target counts one optimizer step's SGD update equals the 11 as one batch."""
    from gaplan.integrations.hf_trainer import GaplanTrainer
    from gaplan.plan.split import make_plan
    from gaplan.workload.loss import summed_token_loss

    samples = _samples(11)
    plan = make_plan(11, 4)
    assert plan.micro_batch_sizes == (4, 4, 3)
    reference = _model()
    start = {n: p.detach().clone() for n, p in reference.named_parameters()}
    whole = _collate(samples)
    (summed_token_loss(reference(**whole).logits, whole, "causal-lm") / (whole["labels"][:, 1:] != -100).sum()).backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()

    args = transformers.TrainingArguments(str(tmp_path), per_device_train_batch_size=1, gradient_accumulation_steps=1,
                                          max_steps=1, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
                                          max_grad_norm=0.0, weight_decay=0.0, report_to=[], use_cpu=True,
                                          save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=7)
    trainer = GaplanTrainer(model=_model(), args=args, train_dataset=samples, data_collator=_collate, plan=plan,
                            noise_scale=False)
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 3)
    sizes = record_micro_batch_sizes(trainer)
    trainer.train()
    assert sorted(sizes) == [3, 4, 4]
    expected = {name: param.detach() for name, param in reference.named_parameters()}
    worst = worst_update_difference(trainer.model, expected, start)
    assert worst < 1e-5, worst


@pytest.mark.slow
@pytest.mark.parametrize("fed_by", ["plan", "the Trainer's sampler"])
def test_gaplan_trainer_reads_the_exact_noise_scale_of_a_finite_corpus(tmp_path, fed_by):
    """The finite corpus of tests/training/test_noise_scale_finite.py (exact B_simple 0.33 N from every per-sample
    gradient) through GaplanTrainer: plan= (its PlanBatchSampler) or the Trainer's own RandomSampler draws each step
    of 96 (4 x 24) without replacement from one epoch's permutation of the 240 samples, and the reading is corrected
    for it. One seed, 200 steps: within 5% (12 seeds averaged 0.999 of exact through the plan; taken as independent
    draws, 1.44-1.55)."""
    from torch import nn

    from gaplan.integrations.hf_trainer import GaplanTrainer
    from gaplan.plan.split import make_plan
    from tests.training import finite_corpus
    from tests.training import test_noise_scale_finite as finite

    state, samples, (_, _, exact) = finite._point()
    net = finite_corpus.model(finite.VOCAB)
    net.load_state_dict(state)

    class Logits(nn.Module):  # the corpus's model, with the logits a Trainer's model returns
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask=None):
            return {"logits": self.net(input_ids=input_ids).logits}

    rows = [{"input_ids": torch.tensor(s.ids), "labels": torch.tensor(s.ids)} for s in samples]
    args = transformers.TrainingArguments(str(tmp_path), max_steps=200, learning_rate=1e-12, optim="sgd",
                                          lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
                                          report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                                          disable_tqdm=True, seed=0, remove_unused_columns=False,
                                          per_device_train_batch_size=finite.MICRO,
                                          gradient_accumulation_steps=finite.EFFECTIVE // finite.MICRO)
    trainer = GaplanTrainer(model=Logits(), args=args, train_dataset=rows, task="causal-lm",
                            data_collator=lambda batch: {k: torch.stack([r[k] for r in batch]) for k in batch[0]},
                            plan=make_plan(finite.EFFECTIVE, finite.MICRO) if fed_by == "plan" else None)
    readings = []

    class Readings(transformers.TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            if trainer.noise_meter is not None and trainer.noise_meter.last is not None:
                readings.append(trainer.noise_meter.last)

    trainer.add_callback(Readings())
    trainer.train()
    assert len(readings) == 200 and {r.drawing for r in readings} == {"epochs"}
    measured = (sum(r.step_grad_var / r.items_per_sample for r in readings) /
                sum(r.step_grad_sq for r in readings))
    assert abs(measured / exact - 1) < 0.05, (measured, exact)


def test_a_plan_that_is_not_a_plan_is_one_line(tmp_path):
    """GaplanTrainer(plan="plan.json"), a path as plan_training_arguments takes one: said so, not an AttributeError."""
    from transformers import TrainingArguments

    from gaplan.integrations.hf_trainer import GaplanTrainer
    from gaplan.workload.build import WorkloadSpec, build_workload

    model = build_workload(WorkloadSpec(model="tiny-gpt2", seq_len=16), "cpu", seed=0).model
    with pytest.raises(GaplanError, match="plan must be a gaplan Plan .*got 'plan.json'"):
        GaplanTrainer(model=model, args=TrainingArguments(str(tmp_path), use_cpu=True, report_to=[]),
                      plan="plan.json")
