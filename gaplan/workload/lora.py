"""LoRA adapters on a built model, by peft: the base frozen, only the adapters trained.

``WorkloadSpec(lora=True, lora_r=16, lora_alpha=32, lora_dropout=0.05, lora_targets=None)`` wraps the model with
``peft.get_peft_model``; ``lora_targets`` None takes peft's own targets for the architecture (GPT-2 ``c_attn``,
Llama ``q_proj,v_proj``, BERT ``query,value``), ``all-linear`` every linear layer but the output head. The optimizer
then takes the adapters alone (:func:`gaplan.workload.build.make_optimizer` takes what requires grad), so the
frozen base has no gradients and no optimizer states; peft keeps the adapters in fp32 over a bf16/fp16 base.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.core.lora_targets import parse_lora_targets
from gaplan.data.tasks.registry import known_task


def lora_config(spec: Any, task: str) -> Any:
    """The ``peft.LoraConfig`` of ``spec``'s LoRA fields."""
    from gaplan.workload.quantize import quiet_bitsandbytes

    try:
        with quiet_bitsandbytes():
            from peft import LoraConfig
    except ImportError:
        raise GaplanError("--lora needs peft: pip install 'gaplan[lora]'") from None
    return LoraConfig(r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                      target_modules=spec.lora_target_modules, task_type=_peft_task_type(task))


def _peft_task_type(task: str) -> str | None:
    """peft's task type of ``task`` (its component's): it decides the wrapper class, and so what save_pretrained
    writes and from_pretrained loads; None for a task peft has none for (masked-lm)."""
    component = known_task(task)
    return component.peft_task_type if component is not None else None


def apply_lora(model: Any, spec: Any, task: str) -> Any:
    """``model`` with LoRA adapters (a ``PeftModel``); a one-line error for targets the model does not have."""
    import warnings

    config = lora_config(spec, task)  # imports peft, quietly
    from peft import get_peft_model

    try:
        with warnings.catch_warnings():
            # peft turns fan_in_fan_out on for GPT-2's Conv1D itself, and says so; it asks transformers 5 a deprecated
            # question about checkpointing. Neither is the user's to act on.
            warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False")
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model" and the like
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GaplanError(f"--lora on {spec.model}: {message}") from None


def is_peft_model(model: Any) -> bool:
    model = getattr(model, "module", model)  # a DDP wrapper's model
    return type(model).__name__.startswith("Peft") and hasattr(model, "peft_config")


def read_adapter_config(path: str) -> dict[str, Any]:
    """``--lora-config FILE``: an ``adapter_config.json`` (a file or the adapter folder) as the spec's LoRA fields."""
    file = os.path.join(path, "adapter_config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as stream:
            config = json.load(stream)
    except UnicodeDecodeError as exc:
        raise GaplanError(f"--lora-config {path} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}") from None
    except FileNotFoundError:
        where = f"no adapter_config.json in {path}" if os.path.isdir(path) else "no such file"
        raise GaplanError(f"--lora-config {path}: {where}") from None
    except OSError as exc:
        raise GaplanError(f"--lora-config {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise GaplanError(f"--lora-config {path} is not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise GaplanError(f"--lora-config {path} is not a LoRA adapter config (peft_type "
                          f"{config.get('peft_type') if isinstance(config, dict) else '?'})")
    fields: dict[str, Any] = {"lora": True}
    for key, name, kind in (("r", "lora_r", int), ("lora_alpha", "lora_alpha", float),
                            ("lora_dropout", "lora_dropout", float)):
        if key in config:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
                # a JSON string "0.1" is no number to peft either: said here, with the file's key
                raise GaplanError(f'--lora-config {path}: "{key}" must be {"an integer" if kind is int else "a number"} '
                                  f"(got {json.dumps(value)})")
            fields[name] = value
    targets = config.get("target_modules")
    if isinstance(targets, (str, list)):
        fields["lora_targets"] = parse_lora_targets(targets)
    elif targets is not None:  # not peft's default to fall back on without a word
        raise GaplanError(f'--lora-config {path}: "target_modules" must be a module name or a list of them (got '
                          f"{json.dumps(targets)})")
    return fields
