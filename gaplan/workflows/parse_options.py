"""From a command's parsed options (a flat mapping by option name, as click gives them) to the library's typed
objects, with the checks every command shares: the workload spec (LoRA settings given without ``--lora``, the two
names of one length), sizes, the memory budget, the data source, ``--batch-by tokens``' needs.

The per-command objects (:mod:`gaplan.workflows.probe_options`, ``bench_options``, ``estimate_options``,
``plan_options``) are built with these; the CLI only hands them click's parameters and which of them were given.
No torch at import.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

from gaplan.core.errors import GaplanError

T = TypeVar("T")


def lora_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's LoRA fields of the parsed options: ``--lora-config``'s file, when given, in place of the others."""
    if not options.get("lora_config"):
        return {}
    from gaplan.workload.lora import read_adapter_config

    return read_adapter_config(options["lora_config"])


def length_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """``seq_len`` from ``--seq-len`` or its other name ``--source-len`` (one of them), for the spec's fields."""
    seq_len, source_len = options.get("seq_len"), options.get("source_len")
    if seq_len is not None and source_len is not None and seq_len != source_len:
        raise GaplanError(f"--seq-len {seq_len} and --source-len {source_len} are one length: give one")
    return {"seq_len": seq_len if seq_len is not None else source_len}


def check_lora_given(options: Mapping[str, Any], given: Collection[str]) -> None:
    """LoRA's settings given without ``--lora`` would train a full fine-tune and ignore them, and beside
    ``--lora-config`` its file would replace them (given at its default too: ``given`` is the names the user gave, as
    the command line's parser knows them)."""
    from gaplan.workload.spec import LORA_SETTINGS

    named = sorted(set(given) & set(LORA_SETTINGS))
    flags = ", ".join("--" + name.replace("_", "-") for name in named)
    if named and options.get("lora_config"):  # the file's settings take their place: one of the two would be lost
        raise GaplanError(f"{flags} and --lora-config both set the adapters' settings: give one")
    if named and not options.get("lora"):
        raise GaplanError(f"{flags} {'sets' if len(named) == 1 else 'set'} LoRA adapters, and --lora is off: add "
                          "--lora, or leave it out")


def spec_from_flat(options: Mapping[str, Any], given: Collection[str] = (), *, device: bool = True,
                   **overrides: Any):
    """The workload of the parsed options, by :class:`WorkloadSpec`'s fields, checked (and for ``device``, checked
    against ``options["device"]``). ``grad_checkpointing`` is a :class:`Checkpointing`, AUTO or None: the spec holds
    the blocks chosen (off when not given; AUTO is the tuner's to decide, with it off, and refused where
    ``overrides`` say ``auto_checkpointing=False``: a command that times nothing)."""
    from gaplan.core.checkpointing import AUTO, OFF, Checkpointing
    from gaplan.core.options import OptionError, from_options
    from gaplan.workload.spec import WorkloadSpec

    resumed = bool(options.get("resume"))  # the values given are checked against the run's, merged, then validated
    if not resumed:
        check_lora_given(options, given)
    checkpointing = options.get("grad_checkpointing")
    if checkpointing == AUTO and not overrides.pop("auto_checkpointing", True):  # it was taken as off, unsaid
        raise OptionError("grad_checkpointing auto applies to probe, bench and train (they time both and keep the "
                          "faster): give off, on, every:K, layers:N or ops", "grad_checkpointing")
    fields = {"grad_checkpointing": checkpointing if isinstance(checkpointing, Checkpointing) else OFF,
              **lora_fields(options), **length_fields(options), **overrides}
    spec = from_options(WorkloadSpec, options, **fields)
    spec = spec if resumed else spec.validate()
    return spec.check_device(options.get("device") or "auto") if device else spec


def command_from_options(cls: type[T], options: Mapping[str, Any], given: Collection[str] = (),
                         command: str | None = None) -> T:
    """A command's object (``ProbeCommand``, ``TrainCommand`` ...) from click's parameters, by its fields: ``spec`` the
    workload's (:func:`spec_from_flat`, with the class's ``SPEC_OPTIONS``), a ``given`` field the names the user gave,
    its nested objects from the same options, and ``command`` (the command line) the field of that name wherever one
    is."""
    from gaplan.core.options import from_options

    prefill = getattr(cls, "with_run_options", None)
    if prefill is not None:  # a command that continues a run: the run's own options for those not given
        options = prefill(options, given)
    spec = spec_from_flat(options, given, **getattr(cls, "SPEC_OPTIONS", {}))
    fields = {"given": frozenset(given)} if "given" in cls.__dataclass_fields__ else {}
    return from_options(cls, {**options, "command": command}, spec=spec, **fields)


def parse_batch_range(value: str | Sequence[int] | None) -> tuple[int, int] | None:
    """``--batch-range LOW:HIGH`` (or a config file's ``[LOW, HIGH]``) -> (low, high), positive integers with low <=
    high; else a one-line error."""
    if value is None:
        return None
    text = value if isinstance(value, str) else ":".join(map(str, value))
    low, colon, high = text.partition(":")
    if colon and low.strip().isdigit() and high.strip().isdigit() and 1 <= int(low) <= int(high):
        return int(low), int(high)
    raise GaplanError(f"--batch-range must be LOW:HIGH, positive integers with LOW <= HIGH, e.g. 8:256 (got {value!r})")


def parse_sizes(value: str | Sequence[int] | None) -> list[int] | None:
    """``--sizes B1,B2`` (or a config file's list): at least two positive micro-batches (None: the estimate's own)."""
    if not value:
        return None
    text = value if isinstance(value, str) else ",".join(map(str, value))
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GaplanError(f"--sizes must be comma-separated positive integers (got {text!r})") from None
    check_sizes(sizes, text)
    return sizes


def check_sizes(sizes: Sequence[int], shown: object) -> None:
    """``--sizes``' values: at least two, each a positive integer (``shown``: as the error quotes them)."""
    if len(sizes) < 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise GaplanError(f"--sizes needs at least two positive micro-batch sizes (got {shown!r})")


def granule_of(granule: int | None, batch_by: str) -> int:
    """``granule`` applies to ``batch_by`` tokens; left out, it is the default (64). Every command's one check."""
    from gaplan.core.options import OptionError
    from gaplan.plan.tokens import DEFAULT_GRANULE, check_granule

    if granule is None:
        return DEFAULT_GRANULE
    check_granule(granule)
    if batch_by == "samples":
        raise OptionError("granule applies to batch_by tokens (a probed token budget is a multiple of it)", "granule",
                          "batch_by")
    return granule


def data_given(source: Any):
    """``source`` when it names data, else None; a field of it given without data is refused (one line)."""
    if source is None or source.path:
        return source
    source.check_applies(None)
    return None


def check_tokens_apply(spec: Any) -> None:
    """A token budget is one length per sample: a seq2seq-lm sample has two, so ``--batch-by tokens`` is refused."""
    from gaplan.data.tasks.registry import task_component
    from gaplan.workload.spec import model_source_kind

    if model_source_kind(spec.model) == "function":
        return
    from gaplan.workload.build import model_shape

    if spec.target_len is not None or task_component(model_shape(spec)[0]).has_target:
        raise GaplanError("--batch-by tokens budgets one length per sample; a seq2seq-lm sample has two (source and "
                          "target), so it is not supported there: batch by samples (the default)")


def check_by_tokens(spec: Any, data: Any, world_size: int, command: str) -> None:
    """What every ``--batch-by tokens`` probe needs: the data's lengths, one device, one length per sample."""
    check_tokens_apply(spec)
    if not data:
        raise GaplanError(f"--batch-by tokens probes the token budget from the data's lengths: give --data "
                          f"(gaplan {command} --data FILE --batch-by tokens)")
    if spec.parallel == "fsdp" or world_size != 1:
        raise GaplanError(f"gaplan {command} --batch-by tokens probes one device: use --world-size 1 and "
                          "--parallel ddp (gaplan train under torchrun probes T* per node)")


def target_budget(target: str | None, memory_limit: int | None, device: str) -> int | None:
    """``--target``'s memory, to emulate it on a larger GPU: a card's memory, as ``--memory-limit`` is, so the probe's
    worker takes the context's allowance off it and the allocator holds the rest, cuBLAS's workspaces included."""
    if not target:
        return None
    from gaplan.estimate import lookup_target

    if memory_limit is not None:
        raise GaplanError("--target and --memory-limit both set the budget: give one")
    from gaplan.devices.backend import resolve_device

    if resolve_device(device) == "cpu":
        raise GaplanError("--target emulates a GPU on a larger one: it needs a CUDA device (this run is on CPU)")
    return lookup_target(target).total_bytes


def check_command_fields(command: Any, device: bool = True) -> None:
    """A command object as a Python caller builds it, read as the command line would give it: ``spec`` a checked
    :class:`WorkloadSpec`, ``memory_limit`` bytes (a size as text, ``"256MiB"``, read as the flag reads it), with
    ``device`` a ``--device`` gaplan reads, every field with ``choices`` one of them."""
    import dataclasses

    from gaplan.core.options import OptionError, check_positive_ints
    from gaplan.core.units import parse_bytes
    from gaplan.workload.spec import WorkloadSpec

    if not isinstance(command.spec, WorkloadSpec):
        raise OptionError(f"spec must be a WorkloadSpec (got {command.spec!r})", "spec")
    if not getattr(command, "resume", None):  # a resume's values are merged into the run's, then validated
        command.spec.validate()
    if isinstance(command.memory_limit, str):  # the Python API's edge: "256MiB" (the command line gives bytes)
        object.__setattr__(command, "memory_limit", parse_bytes(command.memory_limit))
    check_positive_ints(memory_limit=command.memory_limit)
    from gaplan.devices.cpu import check_threads

    check_threads(getattr(command, "threads", None))  # a command's own (probe's, train's: their options check theirs)
    if device:
        from gaplan.devices.backend import device_name

        object.__setattr__(command, "device", device_name(command.device))  # tpu, cpu:0: refused, not modelled
    for field in dataclasses.fields(command):  # its own (a nested object checks its own)
        value, choices = getattr(command, field.name), field.metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise OptionError(f"{field.name} must be one of {', '.join(choices)} (got {value!r})", field.name)
