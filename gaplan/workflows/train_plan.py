"""The plan every rank of ``gaplan train`` trains with: one probe per node, the smallest edge over the nodes.

B* (:func:`plan_for_ranks`) or, batching by tokens, T* (:func:`probe_token_budget_for_ranks`): the first process of
each node probes on its device while the others wait; every node says its own edge and all take the smallest.
With ``--batch-schedule``, the schedule between ``--effective-batch-min`` and that plan (:func:`batch_schedule_for`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH
from gaplan.core.errors import GaplanError
from gaplan.core.lines import trial_line
from gaplan.core.progress import Say, quiet
from gaplan.plan.schedule import BatchSchedule
from gaplan.plan.split import Plan, default_search_cap, make_plan
from gaplan.plan.tokens import DEFAULT_GRANULE
from gaplan.runs.probe_result import ProbeResult
from gaplan.workflows.train_options import TrainOptions
from gaplan.workload.spec import WorkloadSpec


def plan_for_ranks(spec: WorkloadSpec, options: TrainOptions, device: str, memory_limit: int | None, dist: Any,
          say: Say) -> tuple[WorkloadSpec, ProbeResult | None, Plan]:
    """The plan every rank trains with, and the probe it came from (None with ``--micro-batch``).

    One probe per node: the node's first process probes (its trials run on its device), the others wait;
    the smallest B* of all nodes is taken, and each node says its own.
    """
    from gaplan.probing.cache import probe_for

    effective = options.effective_batch or DEFAULT_EFFECTIVE_BATCH
    probed = None
    if options.token_budget:  # packed by tokens each step: the plan gives only E and the ranks' equal shares
        return spec, None, make_plan(effective, default_search_cap(effective, dist.world_size), dist.world_size)
    if options.plan_file or options.micro_batch is None:
        if options.plan_file or dist.local_rank == 0:
            node = f"[rank {dist.rank}] " if dist.active else ""
            node_say = (lambda text: say(node + text)) if dist.local_rank == 0 else quiet
            spec, probed = probe_for(spec, device, memory_limit, default_search_cap(effective, dist.world_size),
                                     plan_file=options.plan_file, grad_checkpointing=options.grad_checkpointing,
                                     threads=options.threads, ddp=dist.world_size > 1,
                                     write_cache=dist.local_rank == 0, say=node_say,
                                     on_trial=lambda trial: node_say(trial_line(trial)))
            if dist.active and not options.plan_file:
                node_say(f"this node's largest micro-batch: {probed.max_micro_batch}")
            effective = options.effective_batch or (probed.plan.effective_batch if options.plan_file else effective)
        dist.barrier()  # the node's other processes wait for its probe
        # Every node's B* stays in its own record; the plan's cap is the smallest over the nodes.
        cap = dist.min(probed.plan_cap if probed is not None else 2**62)
    else:
        cap = options.micro_batch
    if options.lr_scaling != "none" and not options.resume and options.batch_schedule.kind == "fixed":
        # (a resumed run's saved spec has the scaled rate; a batch schedule scales it at each step instead)
        spec = scaled_for_goodput_plan(spec, probed, effective, options.lr_scaling, say if dist.rank == 0 else quiet)
    if options.micro_batch and probed is not None and options.micro_batch > probed.max_micro_batch:
        raise GaplanError(f"--micro-batch {options.micro_batch} does not fit: the probed maximum is "
                          f"{probed.max_micro_batch}")
    return spec, probed, make_plan(effective, options.micro_batch or cap, dist.world_size)


def scaled_for_goodput_plan(spec: WorkloadSpec, probed: ProbeResult | None, effective: int, rule: str,
                            say: Say) -> WorkloadSpec:
    """``spec`` with its learning rate scaled (``rule``) from the batch a goodput plan measured at to ``effective``."""
    from gaplan.plan.goodput import scaled_learning_rate

    goodput = (probed.tuner or {}).get("goodput") if probed is not None else None
    if not goodput:
        raise GaplanError("--lr-scaling needs a plan from gaplan probe --objective goodput (it scales the learning "
                          "rate from the batch the noise scale was measured at)")
    reference = int(goodput["reference_batch"])
    rate = scaled_learning_rate(spec.learning_rate, effective, reference, rule)
    say(f"learning rate {spec.learning_rate:g} set for effective batch {reference}, {rule} scaling to {effective}: "
        f"{rate:.4g}")
    return dataclasses.replace(spec, lr=rate)


def batch_schedule_for(spec: WorkloadSpec, options: TrainOptions, plan: Plan, say: Say) -> BatchSchedule | None:
    """The run's batch schedule (None: fixed), between ``--effective-batch-min`` (default B* x world size) and the
    plan's effective batch."""
    kind, steps = options.batch_schedule
    if kind == "fixed":
        return None
    minimum = options.effective_batch_min or min(plan.micro_batch_cap * plan.world_size, plan.effective_batch)
    if kind == "adaptive" and plan.world_size == 1 and minimum < 2 <= plan.effective_batch:
        # One sample a step is one micro-batch, which measures no noise scale: the first level that can be measured.
        if not options.resume:
            say(f"batch schedule adaptive: starts at effective batch 2, not {minimum}: on one process the noise "
                "scale needs two micro-batches a step")
        minimum = 2
    schedule = BatchSchedule.of(options.batch_schedule, minimum, plan.effective_batch, plan.world_size)
    if not options.resume:
        say(f"batch schedule {options.batch_schedule}: effective batch {' -> '.join(map(str, schedule.levels))}"
            f"{' (by the noise scale)' if kind == 'adaptive' else ''}, micro-batch at most {plan.micro_batch_cap}")
    if kind == "warmup" and steps >= options.steps:  # legal (a resume may extend the run), but never silent
        say(f"batch schedule {options.batch_schedule} ramps over the run's {options.steps} steps or more: it ends at "
            f"effective batch {schedule.ramp_batch(options.steps - 1)}, not {plan.effective_batch} (--steps "
            f"{steps + 1} or more reaches it)")
    return schedule


def probe_token_budget_for_ranks(spec: WorkloadSpec, corpus: Any, options: TrainOptions, device: str,
                        memory_limit: int | None, dist: Any, say: Say, main_say: Say) -> int:
    """T* for this data (one probe per node, the smallest over the nodes), as :func:`plan_for_ranks` does for B*."""
    from gaplan.plan.tokens import LengthProfile
    from gaplan.probing.tokens import probe_token_budget

    if corpus is None:
        raise GaplanError("--batch-by tokens probes the token budget from the data's lengths: give --data, "
                          "or give --token-budget")
    profile = LengthProfile.of([len(sample.ids) for sample in corpus.samples])
    main_say(f"lengths: {profile.describe()}")
    budget = 1 << 62
    if dist.local_rank == 0:
        node = f"[rank {dist.rank}] " if dist.active else ""
        node_say = (lambda text: say(node + text)) if dist.local_rank == 0 else quiet
        granule = options.granule or DEFAULT_GRANULE
        found, _, _ = probe_token_budget(spec, profile, device, memory_limit, granule, threads=options.threads,
                                      ddp=dist.world_size > 1, say=node_say,
                                      on_trial=lambda trial: node_say(trial_line(trial)))
        node_say(found.describe())
        budget = found.token_budget
    dist.barrier()
    return dist.min(budget)
