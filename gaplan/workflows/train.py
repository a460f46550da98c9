"""``gaplan train`` as a library function: where the plan comes from, the data, the loop, and what is written.

The CLI parses options and calls :func:`run_train`; under torchrun every rank calls it. A run folder
holds ``train.json`` (the workload and options the run was started with), so ``--resume DIR`` alone
continues the run as it was started (:func:`resume_settings`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gaplan.core.atomic_write import atomic_write_text
from gaplan.core.constants import DEFAULT_CPU_BUDGET, DEFAULT_EFFECTIVE_BATCH, DEFAULT_TRAIN_STEPS
from gaplan.core.errors import GaplanError
from gaplan.core.lines import trial_line
from gaplan.core.progress import Say, quiet
from gaplan.plan.split import Plan, default_search_cap, make_plan
from gaplan.plan.tokens import DEFAULT_GRANULE
from gaplan.runs.folder import CHECKPOINT, PLAN_JSON, TRAIN_JSON, TRAIN_LOG_CSV, path_in
from gaplan.runs.probe_result import ProbeResult, save_probe
from gaplan.workflows.bench import run_bench
from gaplan.workflows.probe import plan_without_probe
from gaplan.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class TrainOptions:
    """How ``gaplan train`` runs, beyond the workload: the plan's source, the data, the loop, the outputs."""

    effective_batch: int | None = None  # default: the plan file's, else DEFAULT_EFFECTIVE_BATCH
    effective_tokens: int | None = None  # by tokens: each step takes samples until their real tokens reach this
    micro_batch: int | None = None  # skip the probe
    batch_by: str = "samples"  # or "tokens": each step's samples packed into micro-batches of <= token_budget tokens
    token_budget: int | None = None  # by tokens: given, else probed (T*) from the data's lengths
    granule: int = DEFAULT_GRANULE  # by tokens: a probed budget is a multiple of it
    plan_file: str | None = None
    grad_checkpointing: str | None = None  # as given: None, "on", "off" or "auto" (auto needs a plan file)
    data: str | None = None
    text_field: str = "text"
    label_field: str = "label"
    long_samples: str = "split"  # or "truncate"
    tokenizer: str | None = None  # None: the model folder's own; "bytes"; or a tokenizer folder
    steps: int = DEFAULT_TRAIN_STEPS
    seed: int = 0
    max_grad_norm: float | None = None
    warmup_steps: int = 0
    checkpoint_every: int = 0
    resume: bool = False
    save_weights: str | None = None
    save_model: str | None = None  # a save_pretrained folder of the trained model (and its tokenizer)
    enforce_memory_limit: bool = False  # CPU: train under the budget, as the probe's trials do (real OOMs)
    compare: bool = False
    threads: int | None = None
    command: str | None = None


# What a resumed run must keep (the samples of a step and the weights depend on them) ...
_FIXED_OPTIONS = ("effective_batch", "effective_tokens", "micro_batch", "batch_by", "token_budget", "granule",
                  "plan_file", "data", "text_field", "label_field", "long_samples", "tokenizer", "seed", "max_grad_norm",
                  "warmup_steps")
# ... and what it may change: how long, how often it checkpoints, and the outputs.
_FREE_OPTIONS = ("steps", "checkpoint_every", "save_weights", "save_model", "compare", "threads", "command",
                 "enforce_memory_limit")


@dataclass
class TrainRun:
    """What :func:`run_train` did: the summary (what ``--json`` prints), and whether this is the process that reports."""

    summary: dict[str, Any]
    interrupted: bool
    is_main: bool
    plan: Plan | None = None
    notes: list[str] = field(default_factory=list)


def resume_settings(run_dir: str, given_spec: dict[str, Any], given_options: dict[str, Any]
                    ) -> tuple[WorkloadSpec, TrainOptions, dict[str, Any]]:
    """The workload and options of the run in ``run_dir``, with what the user gave again checked against them.

    ``given_*`` hold only what was given explicitly. A value that contradicts the saved run (another
    workload, seed, effective batch, data) is an error; ``steps`` may be raised to train further.
    Returns the spec, the options and the saved environment (device, memory limit).
    """
    path = path_in(run_dir, TRAIN_JSON)
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        spec = WorkloadSpec(**saved["workload"])
        options = TrainOptions(**{k: v for k, v in saved["options"].items() if k in _FIXED_OPTIONS + _FREE_OPTIONS})
    except FileNotFoundError:
        raise GaplanError(f"--resume {run_dir}: no {TRAIN_JSON} in it (not a gaplan train run folder)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GaplanError(f"--resume {run_dir}: {TRAIN_JSON} cannot be read ({exc.__class__.__name__}: {exc})") from None
    for name, value in given_spec.items():
        if getattr(spec, name) != value:
            raise GaplanError(f"--resume {run_dir}: --{name.replace('_', '-')} {value} contradicts the run's "
                              f"{getattr(spec, name)} (resume continues the run as it was started)")
    for name, value in given_options.items():
        if name in _FIXED_OPTIONS and getattr(options, name) != value:
            raise GaplanError(f"--resume {run_dir}: --{name.replace('_', '-')} {value} contradicts the run's "
                              f"{getattr(options, name)} (resume continues the run as it was started)")
    free = {k: v for k, v in given_options.items() if k in _FREE_OPTIONS}
    return spec, dataclasses.replace(options, resume=True, **free), saved.get("environment", {})


def _save_settings(run_dir: str, spec: WorkloadSpec, options: TrainOptions, device: str,
                   memory_limit: int | None) -> None:
    data = {"workload": spec.to_dict(), "options": dataclasses.asdict(dataclasses.replace(options, resume=False)),
            "environment": {"device": device, "memory_limit": memory_limit}}
    atomic_write_text(path_in(run_dir, TRAIN_JSON), json.dumps(data, indent=2) + "\n")


def run_train(spec: WorkloadSpec, run_dir: str, options: TrainOptions, *, device: str = "auto",
              memory_limit: int | None = None, say: Say = quiet, on_step: Callable[[Any], None] | None = None,
              on_event: Say | None = None, on_row: Callable[[Any], None] | None = None) -> TrainRun:
    """Plan (from ``--plan``, ``--micro-batch``, the cache or a new probe), train, and with ``compare`` bench and report.

    Under torchrun every rank calls this; the first process of each node probes for its node,
    all ranks plan with the smallest B* of any node, and only rank 0 writes the run folder's files
    (``TrainRun.is_main``).
    """
    import torch

    from gaplan.data import SyntheticCorpus, TextCorpus
    from gaplan.devices.backend import make_backend, resolve_device
    from gaplan.parallel.build import build_sharded_workload
    from gaplan.parallel.process_group import end_distributed, init_distributed, local_device
    from gaplan.parallel.state import full_model_state
    from gaplan.training.loop import TrainConfig, train
    from gaplan.training.restart import agree_on_restart
    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import model_source_kind

    device = resolve_device(device)
    formed_here = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    dist = init_distributed(device)
    if options.threads:
        torch.set_num_threads(options.threads)
    if spec.parallel == "fsdp" and not dist.active:
        raise GaplanError("--parallel fsdp shards the model over ranks: launch it with "
                          "torchrun --nproc-per-node N -m gaplan train ... (N at least 2)")
    is_main = dist.rank == 0
    main_say = say if is_main else quiet
    # torchrun restarted the ranks after an OOM under FSDP: the sizes every rank agreed on, or None.
    restart = agree_on_restart(run_dir, dist) if spec.parallel == "fsdp" and dist.active else None
    if restart is not None:
        resumable = os.path.exists(path_in(run_dir, CHECKPOINT))
        if is_main and not resumable and os.path.exists(path_in(run_dir, TRAIN_LOG_CSV)):
            os.remove(path_in(run_dir, TRAIN_LOG_CSV))  # the steps before the failure are trained again
        options = dataclasses.replace(options, resume=options.resume or resumable,
                                      token_budget=restart.token_budget or options.token_budget)
        what = "; ".join(restart.messages) or "a rank on another node ran out of memory under FSDP"
        main_say(f"restarted by torchrun ({what}): going on from "
                 f"{'the last checkpoint' if resumable else 'the start'}")
    if dist.active and device == "cpu" and memory_limit is not None:
        main_say(f"each of the {dist.world_size} ranks has its own {memory_limit / 2**30:.2f} GiB budget "
                 f"({dist.local_world_size} on this machine)")
    corpus = read_training_data(spec, options, main_say)  # before the probe: bad data costs no probe and writes nothing
    if options.batch_by == "tokens" and options.token_budget is None:
        options = dataclasses.replace(options, token_budget=_probe_token_budget(spec, corpus, options, device,
                                                                                memory_limit, dist, say, main_say))
    spec, probed, plan = _plan(spec, options, device, memory_limit, dist, say)
    if restart is not None and restart.micro_batch and plan.micro_batch > restart.micro_batch:
        plan = make_plan(plan.effective_batch, restart.micro_batch, plan.world_size)
    meter = make_backend("cpu" if device == "cpu" else local_device(device))
    if options.enforce_memory_limit and device != "cpu":
        raise GaplanError("--enforce-memory-limit binds a CPU run (on CUDA the card is the limit)")
    # Before the model is built, so an enforced budget counts weights, gradients and optimizer states, as in a
    # probe's trial. Without one nothing is bound; the log's peaks are the whole process's either way.
    if options.enforce_memory_limit:
        from gaplan.workload.build import load_model_code

        load_model_code(spec)  # the libraries' one-time memory before the budget, as the probe's worker does
    meter.activate(memory_limit or DEFAULT_CPU_BUDGET if options.enforce_memory_limit else None,
                   enforce=options.enforce_memory_limit)
    if options.enforce_memory_limit:
        main_say(f"training under an enforced budget of {meter.limit_bytes / 2**20:.0f} MiB (as the probe's trials)")
    # A resumed run's weights come from its checkpoint: no need to read the folder's.
    if spec.parallel == "fsdp":  # no rank's device holds the whole model: built on meta, sharded, filled by rank 0
        build = build_sharded_workload(spec, local_device(device), seed=options.seed, load_weights=not options.resume,
                                       cpu_offload=spec.cpu_offload)
        workload = build.workload
    else:
        workload = build_workload(spec, local_device(device), seed=options.seed, load_weights=not options.resume)
    if not options.resume:
        weights = workload.info.get("weights")
        main_say(f"weights: {workload.info['weights_path']} (pretrained)" if weights == "pretrained"
                 else "weights: random init" if weights == "random" else "weights: built by the model's function")
    if spec.parallel == "fsdp":
        main_say(f"FSDP2: {build.block_count} blocks and the root sharded over {dist.world_size} ranks"
                 + (", parameters and optimizer states offloaded to the CPU" if spec.cpu_offload else "")
                 + f", gradients reduced on {'every micro-step' if spec.grad_sync == 'every' else 'the last micro-step'}")
    if corpus is None and model_source_kind(spec.model) != "function":
        corpus = SyntheticCorpus(workload.seq_len, workload.num_labels or 4, seed=options.seed)
    # The longest sample the steps can hold: the data's (read already), else a full-length synthetic one.
    longest = max(map(len, (s.ids for s in corpus.samples))) if isinstance(corpus, TextCorpus) else workload.seq_len
    if options.token_budget and longest and options.token_budget < longest:
        raise GaplanError(f"--token-budget {options.token_budget} is below the longest sample ({longest} tokens): "
                          "it would not fit in any micro-batch")
    if not options.token_budget:  # by tokens, the micro-batches are packed anew each step (said below)
        main_say(f"plan: {plan.describe()}")
    if is_main:
        os.makedirs(run_dir, exist_ok=True)
        if not options.resume:
            _save_settings(run_dir, spec, options, device, memory_limit)
        record = probed if probed is not None else plan_without_probe(
            spec, device, memory_limit, plan, workload.param_count, workload.task, workload.seq_len)
        save_probe(dataclasses.replace(record, plan=plan, command=options.command), path_in(run_dir, PLAN_JSON))
    config = TrainConfig(steps=options.steps, seed=options.seed, max_grad_norm=options.max_grad_norm,
                         checkpoint_every=options.checkpoint_every, warmup_steps=options.warmup_steps, run_dir=run_dir,
                         token_budget=options.token_budget, effective_tokens=options.effective_tokens,
                         micro_batch_limit=restart.micro_batch if restart is not None else None)
    if options.token_budget:
        step = (f"samples until their real tokens reach {options.effective_tokens}" if options.effective_tokens
                else f"{plan.effective_batch} samples")
        main_say(f"batching by tokens: each step's {step} packed into micro-batches of at most "
                 f"{options.token_budget} padded tokens per rank")
    result = train(workload, plan, corpus, config, resume=options.resume, on_step=on_step,
                   on_event=on_event or main_say, peak_bytes=meter.process_peak_bytes, reset_peak=meter.reset_peak)
    if restart is not None:
        result.oom_fallbacks[:0] = restart.messages  # the failures before torchrun's restart, then this run's
    saving_model = options.save_model and not result.interrupted
    # A sharded model is gathered by every rank together (a collective); rank 0 writes it.
    full_state = full_model_state(workload.model) if options.save_weights or saving_model else None
    if formed_here and dist.active:
        end_distributed()  # the last collective is done; what follows is rank 0's own (saving, --compare)
    if options.save_weights and is_main:
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().clone() for k, v in full_state.items()}
        save_file(state, options.save_weights)  # cloned per name: tied weights no longer share storage
    summary = _summary(run_dir, result)
    if isinstance(corpus, TextCorpus):
        summary["data"] = {"path": options.data, "tokenizer": corpus.tokenizer, **dataclasses.asdict(corpus.stats)}
    if saving_model and is_main:
        from gaplan.workload.model_io import save_model

        summary["model_dir"] = save_model(workload, options.save_model, state_dict=full_state)
        tokenizer = getattr(getattr(corpus, "text_tokenizer", None), "hf", None)
        if tokenizer is not None:  # the tokenizer the data was read with (--tokenizer DIR, or the folder's own)
            tokenizer.save_pretrained(summary["model_dir"])
        main_say(f"model saved to {summary['model_dir']} (loads with AutoModelFor*.from_pretrained and "
                 "AutoTokenizer.from_pretrained)")
    if options.compare and is_main and not result.interrupted:
        from gaplan.runs.probe_result import load_probe

        main_say("timing the plan against other splits and a true large batch ...")
        measured, files = run_bench(load_probe(path_in(run_dir, PLAN_JSON)), run_dir, result.plan.effective_batch,
                                    threads=options.threads, command=options.command, on_row=on_row)
        summary["report"] = files
        summary["throughput"] = measured.to_records()
    return TrainRun(summary, result.interrupted, is_main, result.plan)


def _plan(spec: WorkloadSpec, options: TrainOptions, device: str, memory_limit: int | None, dist: Any,
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
    elif options.grad_checkpointing == "auto":
        raise GaplanError("--grad-checkpointing auto is decided by gaplan probe; give its --plan, or on/off")
    else:
        cap = options.micro_batch
    if options.micro_batch and probed is not None and options.micro_batch > probed.max_micro_batch:
        raise GaplanError(f"--micro-batch {options.micro_batch} does not fit: the probed maximum is "
                          f"{probed.max_micro_batch}")
    return spec, probed, make_plan(effective, options.micro_batch or cap, dist.world_size)


def _probe_token_budget(spec: WorkloadSpec, corpus: Any, options: TrainOptions, device: str,
                        memory_limit: int | None, dist: Any, say: Say, main_say: Say) -> int:
    """T* for this data (one probe per node, the smallest over the nodes), as :func:`_plan` does for B*."""
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
        found, _, _ = probe_token_budget(spec, profile, device, memory_limit, options.granule, threads=options.threads,
                                      ddp=dist.world_size > 1, say=node_say,
                                      on_trial=lambda trial: node_say(trial_line(trial)))
        node_say(found.describe())
        budget = found.token_budget
    dist.barrier()
    return dist.min(budget)


def read_training_data(spec: WorkloadSpec, options: TrainOptions, say: Say):
    """``--data`` read and checked (tokenizer against vocab_size, labels, lengths); None without ``--data``.

    The samples' lengths are written to the length cache (:mod:`gaplan.data.lengths`) on the way.
    """
    from gaplan.data import load_corpus
    from gaplan.data.lengths import DataLengths, save_lengths
    from gaplan.workload.build import model_shape

    if not options.data:
        return None
    _check_data_applies(spec)
    task, seq_len, vocab_size, num_labels = model_shape(spec)
    corpus = load_corpus(options.data, seq_len=seq_len, vocab_size=vocab_size, task=task, num_labels=num_labels,
                         tokenizer_dir=_tokenizer_dir(spec), tokenizer_choice=options.tokenizer,
                         text_field=options.text_field, label_field=options.label_field,
                         long_samples=options.long_samples, trust_remote_code=spec.trust_remote_code)
    say(corpus.describe())
    save_lengths(_lengths_cache(spec, options, task, seq_len),
                 DataLengths([len(sample.ids) for sample in corpus.samples], corpus.stats, corpus.tokenizer,
                             options.data))
    return corpus


def read_data_lengths(spec: WorkloadSpec, options: TrainOptions, say: Say):
    """The token lengths of ``--data``'s samples (:class:`gaplan.data.lengths.DataLengths`), from the length cache
    when this data file, tokenizer and options were read before, else read (and tokenized) as
    :func:`read_training_data` reads them, and cached."""
    from gaplan.data import load_tokenizer
    from gaplan.data.lengths import DataLengths, load_lengths
    from gaplan.workload.build import model_shape

    _check_data_applies(spec)
    if not os.path.exists(options.data):  # as load_corpus says it, before anything is looked up
        raise GaplanError(f"--data {options.data}: cannot read it (no such file or folder)")
    task, seq_len, vocab_size, _ = model_shape(spec)
    cached = load_lengths(_lengths_cache(spec, options, task, seq_len), options.data)
    if cached is None:
        corpus = read_training_data(spec, options, say)
        return DataLengths([len(sample.ids) for sample in corpus.samples], corpus.stats, corpus.tokenizer, options.data)
    # The tokenizer still loads and is checked against this model's vocabulary (the key does not hold the model).
    load_tokenizer(_tokenizer_dir(spec), options.tokenizer, spec.trust_remote_code).check_fits(vocab_size, task)
    say(cached.describe())
    return cached


def _check_data_applies(spec: WorkloadSpec) -> None:
    from gaplan.workload.spec import model_source_kind

    if model_source_kind(spec.model) == "function":
        raise GaplanError("--data does not apply to a module:function model (its function makes the batches)")


def _tokenizer_dir(spec: WorkloadSpec) -> str | None:
    return spec.model if os.path.isdir(spec.model) else None


def _lengths_cache(spec: WorkloadSpec, options: TrainOptions, task: str, seq_len: int) -> str:
    from gaplan.data.lengths import lengths_cache_path

    return lengths_cache_path(options.data, seq_len=seq_len, task=task, tokenizer_dir=_tokenizer_dir(spec),
                              tokenizer_choice=options.tokenizer, text_field=options.text_field,
                              label_field=options.label_field, long_samples=options.long_samples)


def _summary(run_dir: str, result: Any) -> dict[str, Any]:
    logs = result.logs
    return {
        "run_dir": run_dir, "steps": len(logs), "plan": result.plan.to_dict(),
        "loss_first": logs[0].loss if logs else None, "loss_last": logs[-1].loss if logs else None,
        "samples_per_s": (sum(log.samples_per_s for log in logs) / len(logs)) if logs else None,
        "tokens_per_s": (sum(log.tokens_per_s for log in logs) / len(logs)) if logs else None,
        "seconds": round(result.seconds, 2), "oom_fallbacks": result.oom_fallbacks, "interrupted": result.interrupted,
        "padding_fraction": result.padding_fraction,
    }
