"""What a finished train writes and says besides its folder: ``--save-weights``, ``--save-model`` (rank 0, after a
sharded model is gathered), and the run's summary (the CLI's line and ``--json``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from gaplan.core.atomic_write import atomic_write
from gaplan.core.disk import WriteFailed, disk_faults_as_one_line
from gaplan.core.progress import Say
from gaplan.runs.folder import CHECKPOINT
from gaplan.workflows.train_options import TrainOptions


def save_outputs(run_dir: str, options: TrainOptions, workload: Any, corpus: Any, result: Any, dist: Any,
                  formed_here: bool, say: Say) -> dict[str, Any]:
    """End the process group this run formed, write ``--save-weights`` / ``--save-model`` (rank 0), and the summary.

    A sharded model is gathered by every rank together (a collective) before the group ends; rank 0 writes it."""
    from gaplan.data import TextCorpus
    from gaplan.parallel.process_group import end_distributed
    from gaplan.parallel.state import full_model_state

    is_main = dist.rank == 0
    saving_model = options.save_model and not result.interrupted
    full_state = full_model_state(workload.model) if options.save_weights or saving_model else None
    if formed_here and dist.active:
        end_distributed()  # the last collective is done; what follows is rank 0's own (saving, --compare)
    if options.save_weights and is_main:
        from safetensors.torch import save_file

        from gaplan.workload.state_size import tensor_bytes

        state = {k: v.detach().contiguous().clone() for k, v in full_state.items()}
        with outputs_kept_in(run_dir, result, f"--save-weights {options.save_weights}"):
            # cloned per name: tied weights no longer share storage. Atomic, and its size checked first.
            atomic_write(options.save_weights, lambda temp: save_file(state, temp), size=tensor_bytes(state),
                         what=os.path.basename(options.save_weights))
    summary = _summary(run_dir, result, options)
    if result.loss_check is not None:
        from gaplan.training.loss_check import load_loss_check

        # A resumed run skipped it; the folder keeps the check made when the run started.
        saved = load_loss_check(run_dir) if result.loss_check.skipped and options.resume else None
        summary["loss_check"] = saved or result.loss_check.to_dict()
    if isinstance(corpus, TextCorpus):
        summary["data"] = {"path": options.data, "tokenizer": corpus.tokenizer, **dataclasses.asdict(corpus.stats)}
    if saving_model and is_main:
        from gaplan.workload.model_io import save_model

        flags = f"--save-model {options.save_model}" + (" --merge" if options.merge else "")
        with outputs_kept_in(run_dir, result, flags):
            if options.merge and workload.spec.quantize:
                from gaplan.workload.build import full_precision_twin

                saved, full_state = full_precision_twin(workload, seed=options.seed), None
            else:
                saved = workload
            summary["model_dir"] = save_model(saved, options.save_model, state_dict=full_state, merge=options.merge)
            tokenizer = getattr(getattr(corpus, "text_tokenizer", None), "hf", None)
            if tokenizer is not None:  # the tokenizer the data was read with (--tokenizer DIR, or the folder's own)
                with disk_faults_as_one_line(summary["model_dir"], what="the tokenizer"):
                    tokenizer.save_pretrained(summary["model_dir"])
        if workload.spec.lora and not options.merge:
            say(f"adapter saved to {summary['model_dir']} (loads with PeftModel.from_pretrained(base, "
                f"{summary['model_dir']!r}); --merge writes the merged model instead)")
        else:
            from gaplan.data.tokenizer import has_tokenizer

            summary["tokenizer_saved"] = has_tokenizer(summary["model_dir"])
            say(f"model saved to {summary['model_dir']} (loads with AutoModelFor*.from_pretrained"
                + (" and AutoTokenizer.from_pretrained)" if summary["tokenizer_saved"] else "; no tokenizer is in it: "
                   f"the run's data was {'bytes, a token per byte' if options.source.tokenizer == 'bytes' else 'token ids'}"
                   ", and AutoTokenizer would load one that does not read as the run did)"))
    return summary


@contextlib.contextmanager
def outputs_kept_in(run_dir: str, result: Any, flags: str) -> Iterator[None]:
    """A final output that cannot be written: one line that says the trained run is kept in its checkpoint and
    names the ``--resume`` that writes the output from it, without training again."""
    try:
        yield
    except WriteFailed as exc:
        if result.checkpoint_step is None:
            raise
        raise WriteFailed(f"{exc}; the trained run is kept in {run_dir} ({CHECKPOINT}, step {result.checkpoint_step}): "
                          f"once there is room, gaplan train --resume {run_dir} {flags} writes it without training "
                          "again", exc.code) from None


def _summary(run_dir: str, result: Any, options: TrainOptions) -> dict[str, Any]:
    logs = result.logs
    return {
        # by tokens, micro-batches are packed anew each step: the plan held the ranks' share of E, no micro-batch size
        "run_dir": run_dir, "steps": len(logs), "plan": None if options.token_budget else result.plan.to_dict(),
        "token_budget": options.token_budget, "weights": options.save_weights,
        "last_step": logs[-1].step if logs else None, "steps_total": options.steps,  # where it stopped, if it did
        "loss_first": logs[0].loss if logs else None, "loss_last": logs[-1].loss if logs else None,
        "samples_per_s": (sum(log.samples_per_s for log in logs) / len(logs)) if logs else None,
        "tokens_per_s": (sum(log.tokens_per_s for log in logs) / len(logs)) if logs else None,  # real tokens
        "padded_tokens_per_s": _mean([log.padded_tokens_per_s for log in logs]),
        # The probe's peak (above the baseline), and the whole process's resident peak (interpreter and all).
        "peak_bytes": _largest([log.step_peak_bytes for log in logs]),
        "process_peak_bytes": _largest([log.peak_bytes for log in logs]),
        "seconds": round(result.seconds, 2), "oom_fallbacks": result.oom_fallbacks, "interrupted": result.interrupted,
        "padding_fraction": result.padding_fraction,
        "noise_scale": run_noise_scale(result),
        "effective_batches": _effective_batches(logs),
    }


def _effective_batches(logs: list[Any]) -> list[dict[str, int]]:
    """Each run of steps at one effective batch, as ``{"from_step", "effective_batch"}`` (one entry for a fixed
    batch; a batch schedule adds one per change)."""
    runs: list[dict[str, int]] = []
    for log in logs:
        if log.effective_batch is not None and (not runs or runs[-1]["effective_batch"] != log.effective_batch):
            runs.append({"from_step": log.step, "effective_batch": log.effective_batch})
    return runs


def run_noise_scale(result: Any) -> dict[str, Any] | None:
    """The last step's smoothed noise scale and what it says of the effective batch (None when never measured)."""
    from gaplan.plan.goodput import noise_scale_summary

    measured = [log for log in result.logs if log.noise_scale is not None]
    if not measured:
        return None
    last = measured[-1]
    drawing = getattr(result, "noise_drawing", None)
    # The batch the last step trained (a schedule's, or a token-counted step's samples), not the plan's top
    summary = noise_scale_summary(last.effective_batch or result.plan.effective_batch, last.noise_scale,
                                  result.plan.world_size)
    if drawing == "unknown":  # not a number that looks exact: the workload did not say how it draws
        summary += (" [assuming independent draws: the workload does not say how it draws its samples; drawn "
                    "without replacement from N it reads high by about 1/(1 - B_noise/N) (CustomWorkload.draws)]")
    return {"noise_scale": last.noise_scale, "grad_sq": last.grad_sq, "grad_var": last.grad_var,
            "steps_measured": len(measured), "drawing": drawing, "summary": summary}


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _largest(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
