"""The Hugging Face integration: batch arguments from a plan, the snippet, and a Trainer that matches gaplan.train."""

import copy
import json
import os
import warnings

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.data import SyntheticCorpus, collate, step_indices
from gaplan.integrations.transformers import UnevenPlanWarning, even_plan, hf_snippet, plan_training_arguments
from gaplan.plan.split import make_plan
from gaplan.training.loop import TrainConfig, _schedule, train
from gaplan.workload.build import WorkloadSpec, build_workload

from ..tolerances import assert_close_at_scale

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

SEQ = 16
SEED = 0


@pytest.fixture
def base_args(tmp_path):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
        per_device_train_batch_size=99, gradient_accumulation_steps=99, auto_find_batch_size=True,
        learning_rate=3e-4, remove_unused_columns=False, dataloader_pin_memory=False, seed=SEED)


def planned(args, world_size):
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size


# --- arithmetic -----------------------------------------------------------------------------------------------


def test_even_plan_is_the_largest_divisor_under_the_cap():
    for effective in range(1, 97):
        for world in (1, 2, 3, 4):
            if effective % world:
                continue
            for cap in range(1, 40):
                plan = make_plan(effective, cap, world)
                even = even_plan(plan)
                share = effective // world
                assert even.is_even and even.micro_batch <= cap and share % even.micro_batch == 0
                assert even.micro_batch * even.grad_accum_steps * world == effective
                assert even.micro_batch == max(d for d in range(1, min(cap, share) + 1) if share % d == 0)
                if plan.is_even:
                    assert even is plan


def test_even_plan_of_the_design_example():
    plan = make_plan(256, 48)
    assert plan.micro_batch_sizes == (43, 43, 43, 43, 42, 42)
    even = even_plan(plan)
    assert (even.micro_batch, even.grad_accum_steps) == (32, 8)


# --- plan_training_arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size, expected", [(1, (32, 8)), (2, (32, 4))])
def test_arguments_from_an_even_plan(base_args, world_size, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an even plan warns about nothing
        args = plan_training_arguments(None, base_args, 256, plan=make_plan(256, 32), world_size=world_size)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == expected
    assert planned(args, world_size) == 256
    assert args.auto_find_batch_size is False
    assert base_args.per_device_train_batch_size == 99, "the caller's arguments are not changed"
    assert args.output_dir == base_args.output_dir and args.learning_rate == base_args.learning_rate


def test_world_size_defaults_to_the_arguments(base_args):
    assert base_args.world_size == 1
    args = plan_training_arguments(None, base_args, 64, plan=make_plan(64, 16, world_size=4))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 4)


@pytest.mark.parametrize("world_size, expected", [(1, (32, 8)), (2, (32, 4))])
def test_uneven_plan_warns_and_splits_evenly(base_args, world_size, expected):
    with pytest.warns(UnevenPlanWarning, match="needs equal micro-batches") as caught:
        args = plan_training_arguments(None, base_args, 256, plan=make_plan(256, 48), world_size=world_size)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == expected
    assert planned(args, world_size) == 256
    message = str(caught[0].message)
    assert ("43,43,43,43,42,42" if world_size == 1 else "43,43,42") in message
    assert ("240 or 288" if world_size == 1 else "192 or 288") in message


def test_plan_trainer_returns_the_plan_at_b_star_and_the_even_split_its_arguments_run(base_args):
    from gaplan.integrations.transformers import plan_trainer

    with pytest.warns(UnevenPlanWarning, match=r"240 or 288.*GaplanTrainer\(\.\.\., plan=result.plan\)"):
        found = plan_trainer(None, base_args, 256, plan=make_plan(256, 48))
    assert found.max_micro_batch == 48 and found.plan == make_plan(256, 48) and not found.plan.is_even
    assert found.split == even_plan(found.plan) and (found.split.micro_batch, found.split.grad_accum_steps) == (32, 8)
    assert (found.args.per_device_train_batch_size, found.args.gradient_accumulation_steps) == (32, 8)
    assert found.probe is None and found.trials == []  # given, not probed
    assert "the arguments run effective batch 256 = micro-batch 32 x 8" in found.describe()


def test_a_prime_share_falls_back_to_micro_batch_one(base_args):
    with pytest.warns(UnevenPlanWarning):
        args = plan_training_arguments(None, base_args, 251, plan=make_plan(251, 48))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (1, 251)


def test_batch_not_divisible_by_world_size_is_an_error(base_args):
    with pytest.raises(GaplanError, match="not divisible by the world size 2"):
        plan_training_arguments(None, base_args, 255, plan=make_plan(256, 32), world_size=2)
    with pytest.raises(GaplanError, match="not divisible by the world size 2"):
        plan_training_arguments("tiny-gpt2", base_args, 255, world_size=2)  # before any probing


def test_plan_file_and_probe_result_use_the_tuners_choice(base_args, tmp_path):
    from gaplan.runs.probe_result import ProbeResult, load_probe, save_probe

    result = ProbeResult(
        workload=WorkloadSpec(model="tiny-gpt2", seq_len=SEQ), device="cpu", memory_limit_bytes=2**28, margin=0.0,
        probe_limit_bytes=2**28, budget_is_default=False, max_micro_batch=48, capped=False, trials=[],
        plan=make_plan(256, 48), param_count=1, static_bytes=1, task="causal-lm", seq_len=SEQ, wall_seconds=1.0,
        tuner={"micro_batch": 16})
    path = str(tmp_path / "plan.json")
    save_probe(result, path)
    for plan in (path, load_probe(path), result):
        args = plan_training_arguments(None, base_args, 128, plan=plan)
        assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 8)
    with pytest.raises(GaplanError, match="does not exist"):
        plan_training_arguments(None, base_args, 128, plan=str(tmp_path / "missing.json"))
    with pytest.raises(GaplanError, match="plan= must be"):
        plan_training_arguments(None, base_args, 128, plan=42)
    with pytest.raises(GaplanError, match="give a model"):
        plan_training_arguments(None, base_args, 128)


def test_a_model_is_probed_through_its_config(base_args, monkeypatch):
    """The model's config goes to a directory the probe can build from; the arguments shape the workload."""
    import importlib

    probing = importlib.import_module("gaplan.probing.edge")

    model = transformers.AutoModelForCausalLM.from_config(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64))
    seen = {}

    def fake_probe(spec, device, memory_limit, effective_batch, world_size):
        seen.update(spec=spec, device=device, memory_limit=memory_limit, effective_batch=effective_batch,
                    world_size=world_size,
                    config=json.load(open(os.path.join(spec.model, "config.json"))))
        seen["params"] = build_workload(spec, "cpu").param_count  # the directory exists while the probe runs

        class Result:
            plan_cap = 24
        return Result()

    monkeypatch.setattr(probing, "probe", fake_probe)
    args = plan_training_arguments(model, base_args, 96, memory_limit="256MiB", seq_len=SEQ, world_size=2)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (24, 2)
    spec = seen["spec"]
    assert (spec.task, spec.seq_len, spec.dtype, spec.optimizer, spec.lr) == ("causal-lm", SEQ, "fp32", "adamw-fused", 3e-4)
    assert seen["config"]["n_embd"] == 32 and seen["params"] == sum(p.numel() for p in model.parameters())
    assert (seen["device"], seen["memory_limit"], seen["effective_batch"], seen["world_size"]) == \
        ("cpu", 256 * 2**20, 96, 2)
    assert not os.path.exists(spec.model), "the temporary config directory is removed"


def test_a_plain_module_cannot_be_probed_directly(base_args):
    with pytest.raises(GaplanError, match="not a transformers model"):
        plan_training_arguments(torch.nn.Linear(2, 2), base_args, 8)


# --- hf_snippet -----------------------------------------------------------------------------------------------


def test_snippet_builds_the_planned_arguments(tmp_path):
    snippet = hf_snippet(make_plan(256, 64, world_size=2), output_dir=str(tmp_path / "out"))
    assert "per_device_train_batch_size=64," in snippet and "gradient_accumulation_steps=2," in snippet
    assert "torchrun --nproc-per-node 2" in snippet and "average_tokens_across_devices=True" in snippet
    assert "GaplanTrainer" in snippet
    namespace = {}
    exec(snippet, namespace)  # noqa: S102 - the snippet must be valid Python as printed
    args = namespace["args"]
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (64, 2)


def test_snippet_of_an_uneven_plan_says_so():
    snippet = hf_snippet(make_plan(256, 48))
    assert "per_device_train_batch_size=32," in snippet and "gradient_accumulation_steps=8," in snippet
    assert "43,43,43,43,42,42 is uneven" in snippet and "(micro-batch cap 48)" in snippet
    assert "torchrun" not in snippet


# --- GaplanTrainer == gaplan.train ----------------------------------------------------------------------------


class _StepStream(torch.utils.data.IterableDataset):
    """The samples of steps 0..steps-1 in gaplan.train's order (``step_indices``), so both loops see the same batches."""

    def __init__(self, corpus, effective_batch, steps):
        self.corpus, self.effective_batch, self.steps = corpus, effective_batch, steps

    def __iter__(self):
        for step in range(self.steps):
            for index in step_indices(step, self.effective_batch, len(self.corpus), SEED):
                yield self.corpus[index]


def _hf_losses():
    class Losses(transformers.TrainerCallback):
        def __init__(self):
            self.losses = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    return Losses()


@pytest.mark.slow
@pytest.mark.parametrize("effective_batch, max_micro", [(12, 4), (10, 4)], ids=["even-4x3", "uneven-4,3,3-vs-2x5"])
def test_trainer_matches_gaplan_train(base_args, effective_batch, max_micro):
    """Same data, seed and SGD schedule: the same loss per step and the same weights (fp32, rtol 1e-5).

    The uneven case runs gaplan's 4,3,3 against the Trainer's 2 x 5: the token-exact loss makes the split irrelevant.
    """
    from gaplan.integrations.transformers import GaplanTrainer

    steps = 3
    spec = WorkloadSpec(model="tiny-gpt2", seq_len=SEQ, optimizer="sgd", lr=0.05)
    corpus = SyntheticCorpus(SEQ, seed=SEED)
    plan = make_plan(effective_batch, max_micro)
    workload = build_workload(spec, "cpu", seed=SEED)
    hf_model = copy.deepcopy(workload.model)
    start = {k: v.clone() for k, v in hf_model.state_dict().items()}
    reference = train(workload, plan, corpus, TrainConfig(steps=steps, seed=SEED))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnevenPlanWarning)
        args = plan_training_arguments(None, base_args, effective_batch, plan=plan)
    args = copy.deepcopy(args)
    args.max_steps, args.logging_steps, args.max_grad_norm = steps, 1, 0.0
    assert planned(args, 1) == effective_batch
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == \
        ((4, 3) if plan.is_even else (2, 5))
    optimizer = torch.optim.SGD([p for p in hf_model.parameters() if p.requires_grad], lr=spec.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(TrainConfig(steps=steps)))  # gaplan's schedule
    losses = _hf_losses()
    trainer = GaplanTrainer(model=hf_model, args=args, train_dataset=_StepStream(corpus, effective_batch, steps),
                            data_collator=lambda samples: collate(samples, "causal-lm", SEED),
                            optimizers=(optimizer, scheduler), callbacks=[losses])
    assert trainer.gaplan_task == "causal-lm"
    trainer.train()

    assert losses.losses == pytest.approx([log.loss for log in reference.logs], rel=1e-5)
    ours, theirs = workload.model.state_dict(), hf_model.state_dict()
    for name, value in ours.items():
        assert_close_at_scale(theirs[name], value, msg=name)
    moved = max(float((ours[k] - start[k]).abs().max()) for k in ours)
    assert moved > 1e-3, "the runs trained: the weights moved"


def test_trainer_optim_names_map_to_gaplan_optimizers_or_are_refused_in_one_line():
    from transformers.training_args import OptimizerNames

    from gaplan.integrations.transformers import TRAINER_OPTIMIZERS, trainer_optimizer
    from gaplan.workload.spec import OPTIMIZERS

    names = {o.value for o in OptimizerNames}
    assert set(TRAINER_OPTIMIZERS) <= names, "every mapped name is one the installed Trainer knows"
    # each gaplan optimizer has a Trainer name, but the for-loop AdamW: no Trainer name runs torch's AdamW that way
    assert set(TRAINER_OPTIMIZERS.values()) == set(OPTIMIZERS) - {"adamw-forloop"}
    assert [trainer_optimizer(OptimizerNames(n)) for n in ("adafactor", "adamw_bnb_8bit", "paged_adamw_8bit",
                                                          "lion_32bit", "sgd", "adamw_torch_fused")] == \
        ["adafactor", "adamw-8bit", "paged-adamw-8bit", "lion", "sgd", "adamw-fused"]
    for name in sorted(names - set(TRAINER_OPTIMIZERS)):  # lion_8bit, paged_lion_32bit, galore_*, rmsprop, ...
        with pytest.raises(GaplanError, match=f"optim '{name}' has no gaplan optimizer") as caught:
            trainer_optimizer(name)
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("args", [{"output_dir": "o"}, None])
def test_arguments_that_are_not_training_arguments_are_one_line(args):
    with pytest.raises(GaplanError, match="args must be a TrainingArguments, or a function that builds one"):
        plan_training_arguments("tiny-gpt2", args, 8, plan=make_plan(8, 4))
