"""gaplan for the Hugging Face ``Trainer``: its batch arguments from a plan, and gaplan's token-exact loss.

    from transformers import TrainingArguments
    from gaplan.integrations.transformers import GaplanTrainer, plan_training_arguments

    args = plan_training_arguments(model, TrainingArguments("out"), effective_batch=256, seq_len=1024)
    GaplanTrainer(model=model, args=args, train_dataset=data, data_collator=collate).train()

Three parts, in increasing import cost:

* :func:`even_plan` and :func:`hf_snippet`: arithmetic on a :class:`~gaplan.plan.split.Plan`, no torch and no
  transformers (``gaplan probe --emit hf`` stays fast);
* :func:`plan_training_arguments`: probes (or loads a plan) and returns a copy of ``TrainingArguments``
  with ``per_device_train_batch_size`` and ``gradient_accumulation_steps`` set (:func:`resolve_plan`
  gives gaplan's plan behind it, to probe once and both print and use it);
* ``GaplanTrainer`` (:mod:`gaplan.integrations.hf_trainer`): a ``transformers.Trainer`` whose loss is the *sum*
  of token losses divided by ``num_items_in_batch``, the targets of the whole optimizer step on all ranks, counted
  by gaplan's rule (:mod:`gaplan.workload.loss`). Built on first access, since it subclasses ``Trainer``.

The Trainer feeds equal micro-batches only. When gaplan's plan is uneven (E=256 at B*=48 is
43,43,43,43,42,42), :func:`plan_training_arguments` takes the largest micro-batch no larger than
B* that divides each device's share (32 x 8 here) and warns with :class:`UnevenPlanWarning`.
Such a split always exists (micro-batch 1 divides any share), so only an effective batch that is
not a multiple of the world size is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gaplan.core.checkpointing import OFF, ON
from gaplan.core.errors import GaplanError
from gaplan.data.tasks.infer import infer_task
from gaplan.plan.split import Plan, even_trade_message, make_plan

if TYPE_CHECKING:
    from torch import nn
    from transformers import TrainingArguments

    from gaplan.runs.probe_result import ProbeResult
    from gaplan.workload.build import WorkloadSpec

__all__ = [
    "GaplanTrainer", "GaplanSeq2SeqTrainer", "GaplanSFTTrainer",  # noqa: F822 - built on first access (__getattr__)
    "TrainerPlan", "UnevenPlanWarning", "even_plan", "hf_snippet", "infer_task", "plan_trainer",
    "plan_training_arguments", "resolve_plan",
]

class UnevenPlanWarning(UserWarning):
    """gaplan's plan has micro-batches of different sizes; the Trainer runs an even split instead."""


def even_plan(plan: Plan) -> Plan:
    """The plan the Trainer can run: equal micro-batches, none larger than the plan's cap.

    ``plan`` itself when it is even; otherwise the plan at the largest micro-batch ``m <= plan.micro_batch_cap``
    that divides each device's share ``E / W`` (the fewest accumulation steps of any even split).
    """
    if plan.is_even:
        return plan
    share = plan.effective_batch // plan.world_size
    micro = max(d for d in range(1, min(plan.micro_batch_cap, share) + 1) if share % d == 0)
    return make_plan(plan.effective_batch, micro, plan.world_size)


def _uneven_message(plan: Plan, even: Plan) -> str:
    """Why the Trainer gets a smaller micro-batch than gaplan planned, and which batch sizes would avoid it."""
    return even_trade_message(plan, even, "the Hugging Face Trainer",
                              "GaplanTrainer(..., plan=result.plan) trains the plan itself")


def hf_snippet(plan: Plan, output_dir: str = "out") -> str:
    """Python to paste into a training script: ``TrainingArguments`` with the plan's batch arguments.

    An uneven plan is given as its :func:`even_plan`, with a comment that says so.
    """
    even = even_plan(plan)
    world = even.world_size
    lines = [
        "from transformers import TrainingArguments",
        "",
        f"# gaplan: effective batch {even.effective_batch} = {even.micro_batch} per device x "
        f"{even.grad_accum_steps} accumulation steps x {world} device(s) (micro-batch cap {plan.micro_batch_cap})",
    ]
    if even is not plan:
        lines.append(f"# (gaplan's plan {','.join(map(str, plan.micro_batch_sizes))} is uneven; "
                     "the Trainer needs equal micro-batches)")
    if world > 1:
        lines.append(f"# launch on {world} processes, e.g. torchrun --nproc-per-node {world} train.py")
    lines.append("# token-exact loss: from gaplan.integrations.transformers import GaplanTrainer (a drop-in Trainer)")
    lines += [
        "args = TrainingArguments(",
        f"    output_dir={output_dir!r},",
        f"    per_device_train_batch_size={even.micro_batch},",
        f"    gradient_accumulation_steps={even.grad_accum_steps},",
    ]
    if world > 1:
        lines.append("    average_tokens_across_devices=True,  # count loss targets over all ranks")
    lines += ["    # ... your other arguments", ")"]
    return "\n".join(lines) + "\n"


def plan_training_arguments(
    model_or_spec: nn.Module | WorkloadSpec | str | None,
    args: TrainingArguments,
    effective_batch: int,
    *,
    plan: str | os.PathLike | Plan | ProbeResult | None = None,
    memory_limit: int | str | None = None,
    device: str = "auto",
    seq_len: int | None = None,
    world_size: int | None = None,
    probe: str = "workload",
    train_dataset: Any = None,
    data_collator: Any = None,
    trainer_class: type | None = None,
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> TrainingArguments:
    """A copy of ``args`` whose batch arguments run ``effective_batch`` samples per optimizer step.

    ``per_device_train_batch_size x gradient_accumulation_steps x world_size == effective_batch``, with the
    largest per-device micro-batch that fits (see the module docstring for uneven plans, which warn with
    :class:`UnevenPlanWarning`). ``auto_find_batch_size`` is turned off: the batch is planned, not searched.

    Args:
        model_or_spec: what to probe when no ``plan`` is given:

            * a transformers model (``PreTrainedModel``): its config is saved to a temporary directory and
              probed as that directory (the model is rebuilt from the config, so weights do not matter,
              and the task comes from its class: causal LM, masked LM or sequence classification);
            * a :class:`~gaplan.workload.build.WorkloadSpec`, used as it is (except ``seq_len``, when given);
            * a string: a preset (``tiny-gpt2``), a model directory, a cached hub id or ``module:function``.

            For a model or a string, precision, optimizer, learning rate and gradient checkpointing come
            from ``args`` (``bf16``/``fp16`` -> autocast; ``optim`` -> gaplan's optimizer by
            :data:`TRAINER_OPTIMIZERS`; an ``optim`` gaplan does not model is refused in one line).
        args: the ``TrainingArguments`` to copy (``dataclasses.replace``; ``args`` is not changed), or a function
            that builds them: with ``probe="trainer"`` on a CUDA machine pass the function, since building the
            arguments sets the CUDA device and the trials could no longer fork.
        effective_batch: samples per optimizer step over all devices.
        plan: use this instead of probing: the path of a ``plan.json`` (``gaplan probe --out``), a
            :class:`~gaplan.runs.probe_result.ProbeResult` (its tuner's micro-batch when it has one, else B*) or a
            :class:`~gaplan.plan.split.Plan` (its ``micro_batch_cap``). Re-planned for ``effective_batch`` and
            ``world_size``.
        memory_limit: the probe's budget in bytes or as text (``"2GiB"``); default: the device's own.
        device: the probe's device; ``auto`` means ``cpu`` when ``args.use_cpu`` is set, else CUDA if any.
        seq_len: the (padded) sequence length to probe at. Memory grows with it: pass your real length
            (default: the preset's, or 512 for a model or directory).
        world_size: data-parallel processes (default: the launch's ``WORLD_SIZE``, 1 without a launcher).
        probe: ``"workload"`` (gaplan's own step on the model rebuilt from its config, as above) or ``"trainer"``:
            each trial runs ``trainer_class(model, args, train_dataset=..., data_collator=...).train()`` itself
            for two steps (:func:`gaplan.integrations.trainer_probe.probe_trainer`): your arguments (precision,
            ``optim``, checkpointing), your model as it is (PEFT included), your collator and the dataset's
            longest samples, so B* is the edge of ``trainer.train()``.
        train_dataset, data_collator, trainer_class, trainer_kwargs: with ``probe="trainer"``: what the trainer is
            built with (``trainer_class`` default ``transformers.Trainer``; TRL's ``SFTTrainer`` works the same).

    Raises:
        GaplanError: when ``effective_batch`` is not a positive multiple of the world size, the model
            cannot be probed, or the plan cannot be read.
        DoesNotFit: when even micro-batch 1 does not fit.
    """
    return plan_trainer(model_or_spec, args, effective_batch, plan=plan, memory_limit=memory_limit, device=device,
                        seq_len=seq_len, world_size=world_size, probe=probe, train_dataset=train_dataset,
                        data_collator=data_collator, trainer_class=trainer_class, trainer_kwargs=trainer_kwargs).args


@dataclasses.dataclass(frozen=True)
class TrainerPlan:
    """What the Trainer route found and what it runs: ``plan`` is gaplan's plan at B* (``max_micro_batch``),
    possibly uneven; ``split`` the even split that ``args`` run (``plan`` itself when it is even); ``probe`` the
    probe behind it, with its trials (a :class:`~gaplan.probing.loop.LoopProbeResult` for ``probe="trainer"``, a
    :class:`~gaplan.runs.probe_result.ProbeResult` for ``"workload"``, None for ``plan=``)."""

    args: Any  # TrainingArguments
    plan: Plan
    split: Plan
    probe: Any = None

    @property
    def max_micro_batch(self) -> int:
        return self.plan.micro_batch_cap

    @property
    def trials(self) -> list:
        """The probe's trials (none when the plan was given)."""
        return list(getattr(self.probe, "trials", None) or [])

    def describe(self) -> str:
        """One line: B*, the trials, the plan, and the split the arguments run when it is another."""
        tried = " ".join(f"{t.micro_batch}{'' if t.fits else 'x'}" for t in self.trials)
        line = f"B* = {self.max_micro_batch}{f' (tried {tried})' if tried else ''}; {self.plan.describe()}"
        return line if self.split == self.plan else f"{line}; the arguments run {self.split.describe()}"


def plan_trainer(model_or_spec: nn.Module | WorkloadSpec | str | None, args: TrainingArguments, effective_batch: int,
                 **options: Any) -> TrainerPlan:
    """:func:`plan_training_arguments` (the same arguments), returning what it found with the arguments: B*, the
    trials, gaplan's plan and the split the arguments run. An uneven plan warns (:class:`UnevenPlanWarning`) that the
    arguments run a smaller even split; ``GaplanTrainer(..., plan=result.plan)`` trains the plan itself."""
    from gaplan.integrations.trainer_probe import built_arguments

    chosen, probed = _chosen_plan(model_or_spec, args, effective_batch, **options)
    even = even_plan(chosen)
    if even is not chosen:
        warnings.warn(_uneven_message(chosen, even), UnevenPlanWarning, stacklevel=3)
    planned = dataclasses.replace(built_arguments(args), per_device_train_batch_size=even.micro_batch,
                                  gradient_accumulation_steps=even.grad_accum_steps, auto_find_batch_size=False)
    return TrainerPlan(planned, chosen, even, probed)


def resolve_plan(model_or_spec: nn.Module | WorkloadSpec | str | None, args: TrainingArguments, effective_batch: int,
                 **options: Any) -> Plan:
    """gaplan's own plan (possibly uneven) behind :func:`plan_training_arguments`, which takes the same arguments
    (its keyword options are ``options``). Useful to probe once and then both build the arguments (``plan=`` the
    result) and show the plan (:func:`hf_snippet`)."""
    return _chosen_plan(model_or_spec, args, effective_batch, **options)[0]


def _chosen_plan(model_or_spec: Any, args: Any, effective_batch: int, *, plan: Any = None,
                 memory_limit: int | str | None = None, device: str = "auto", seq_len: int | None = None,
                 world_size: int | None = None, probe: str = "workload", train_dataset: Any = None,
                 data_collator: Any = None, trainer_class: type | None = None,
                 trainer_kwargs: Mapping[str, Any] | None = None) -> tuple[Plan, Any]:
    """:func:`resolve_plan`'s plan and the probe behind it (None when ``plan`` was given)."""
    from gaplan.integrations.trainer_probe import built_arguments, launch_world_size

    world_size = launch_world_size() if world_size is None else world_size
    from transformers import TrainingArguments

    if not (callable(args) or isinstance(args, TrainingArguments)):  # a dict, None: said so, not an AttributeError
        raise GaplanError(f"args must be a TrainingArguments, or a function that builds one (got {args!r})")
    if probe not in ("workload", "trainer"):
        raise GaplanError(f"probe must be 'workload' or 'trainer' (got {probe!r})")
    if probe == "trainer" and plan is None:
        if model_or_spec is None or isinstance(model_or_spec, str) or not (
                hasattr(model_or_spec, "parameters") or callable(model_or_spec)):
            raise GaplanError("probe='trainer' runs your Trainer on your model: pass the model, or a function that "
                              "builds it (model_init)")
        if train_dataset is None:
            raise GaplanError("probe='trainer' trains on a sample of your data: pass train_dataset=")
        from gaplan.integrations.trainer_probe import probe_trainer

        result = probe_trainer(model_or_spec, args, train_dataset, effective_batch=effective_batch,
                               data_collator=data_collator, trainer_class=trainer_class, memory_limit=memory_limit,
                               world_size=world_size, **dict(trainer_kwargs or {}))
        return result.plan, result
    args = built_arguments(args)  # the workload's trials run in a new process, not forked from this one
    if device == "auto" and getattr(args, "use_cpu", False):
        device = "cpu"
    return _resolve_plan(model_or_spec, args, effective_batch, world_size, plan, memory_limit, device, seq_len)


def _resolve_plan(model_or_spec: Any, args: TrainingArguments, effective_batch: int, world_size: int, plan: Any,
                  memory_limit: int | str | None, device: str, seq_len: int | None) -> tuple[Plan, Any]:
    """gaplan's plan (possibly uneven) for ``effective_batch`` on ``world_size`` devices, and the probe behind it."""
    import importlib

    from gaplan.runs.probe_result import ProbeResult, load_probe

    probing = importlib.import_module("gaplan.probing.edge")  # looked up at call time: tests stand in for its probe

    if plan is not None:
        if isinstance(plan, (str, os.PathLike)):
            plan = load_probe(os.fspath(plan))
        if isinstance(plan, ProbeResult):
            cap = plan.plan_cap
        elif isinstance(plan, Plan):
            cap = plan.micro_batch_cap
        else:
            raise GaplanError(f"plan= must be a plan.json path, a Plan or a ProbeResult (got {type(plan).__name__})")
        return make_plan(effective_batch, cap, world_size), None
    if model_or_spec is None:
        raise GaplanError("give a model, a WorkloadSpec or a preset to probe, or plan= to use an existing plan")
    make_plan(effective_batch, max(1, effective_batch // max(world_size, 1)), world_size)  # a bad batch fails here
    if memory_limit is not None:
        from gaplan.core.units import parse_bytes

        memory_limit = parse_bytes(memory_limit)
    with _workload_spec(model_or_spec, args, seq_len) as spec:
        # The search stops at a device's share of the step (the probe's default cap): more is never used.
        result = probing.probe(spec, device=device, memory_limit=memory_limit, effective_batch=effective_batch,
                               world_size=world_size)
    return make_plan(effective_batch, result.plan_cap, world_size), result


# The Trainer's ``optim`` names (transformers' OptimizerNames, 5.25) whose optimizer keeps the states gaplan counts for
# one of its own (gaplan.workload.optimizer_states). The torch AdamW variants differ in their kernels, not their states;
# bitsandbytes' Lion32bit keeps one float32 momentum, gaplan's Lion one of the weights' dtype (the same for fp32 weights).
TRAINER_OPTIMIZERS = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw-fused", "adamw_torch_xla": "adamw",
    "adamw_torch_npu_fused": "adamw",
    "adamw_bnb_8bit": "adamw-8bit", "adamw_8bit": "adamw-8bit", "paged_adamw_8bit": "paged-adamw-8bit",
    "adafactor": "adafactor", "lion_32bit": "lion", "sgd": "sgd",
}


def trainer_optimizer(optim: Any) -> str:
    """gaplan's ``--optimizer`` for a ``TrainingArguments.optim`` (an OptimizerNames or its string).

    Raises:
        GaplanError: an ``optim`` whose states gaplan does not model (8-bit Lion, paged 32-bit, GaLore, ...).
    """
    name = str(getattr(optim, "value", optim))
    if name not in TRAINER_OPTIMIZERS:
        raise GaplanError(f"TrainingArguments optim {name!r} has no gaplan optimizer to count its states; use one of "
                          f"{', '.join(TRAINER_OPTIMIZERS)}, or pass a WorkloadSpec with --optimizer's closest choice")
    return TRAINER_OPTIMIZERS[name]


@contextlib.contextmanager
def _workload_spec(model_or_spec: Any, args: TrainingArguments, seq_len: int | None) -> Iterator[WorkloadSpec]:
    """The spec to probe; a model's config lives in a temporary directory while the spec is in use."""
    from gaplan.workload.build import WorkloadSpec

    if isinstance(model_or_spec, WorkloadSpec):
        yield model_or_spec if seq_len is None else dataclasses.replace(model_or_spec, seq_len=seq_len)
        return
    fields = dict(seq_len=seq_len, dtype="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
                  optimizer=trainer_optimizer(args.optim), lr=float(args.learning_rate) or 1e-4,
                  grad_checkpointing=ON if args.gradient_checkpointing else OFF)
    if isinstance(model_or_spec, str):
        yield WorkloadSpec(model=model_or_spec, **fields)
        return
    config = getattr(model_or_spec, "config", None)
    if not callable(getattr(config, "save_pretrained", None)):
        raise GaplanError(f"cannot probe a {type(model_or_spec).__name__}: it is not a transformers model; pass a "
                          "WorkloadSpec(model='module:function') that builds it (see examples/custom_model.py)")
    task = infer_task(model_or_spec)
    with tempfile.TemporaryDirectory(prefix="gaplan-hf-") as directory:
        config.save_pretrained(directory)
        yield WorkloadSpec(model=directory, task=task, **fields)


def __getattr__(name: str) -> Any:
    from gaplan.integrations.hf_trainer import named_trainer

    found = named_trainer(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found
