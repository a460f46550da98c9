"""Reading a model folder's weights and writing a fine-tuned model as a folder transformers loads.

Loading is ``AutoModelFor<task>.from_pretrained`` (safetensors or PyTorch bins, sharded or not),
straight onto a CUDA training device; its failures (a corrupted file, weights of another shape)
become one line naming the file. Saving is ``save_pretrained`` (safetensors, tied weights kept)
plus the tokenizer's ``save_pretrained``, into a temp sibling folder renamed into place at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

from gaplan.core.disk import disk_faults_as_one_line, ensure_room
from gaplan.core.errors import GaplanError, one_line
from gaplan.data.tokenizer import has_tokenizer
from gaplan.workload.state_size import tensor_bytes

SAFE_WEIGHTS = "model.safetensors"
BIN_WEIGHTS = "pytorch_model.bin"
_WEIGHTS_NAMES = (SAFE_WEIGHTS, SAFE_WEIGHTS + ".index.json", BIN_WEIGHTS, BIN_WEIGHTS + ".index.json")


def weights_files(folder: str) -> list[str]:
    """The weights files transformers would read in ``folder`` (the names present of ``_WEIGHTS_NAMES``)."""
    if not os.path.isdir(folder):
        return []
    return [name for name in _WEIGHTS_NAMES if os.path.isfile(os.path.join(folder, name))]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars and no warning reports from transformers inside (a library does not print)."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _shards(folder: str) -> tuple[str, dict[str, str]]:
    """The weights format transformers picks (safetensors first) and its map of tensor name -> file path."""
    names = weights_files(folder)
    safe = [n for n in names if n.startswith(SAFE_WEIGHTS)]
    chosen = safe[0] if safe else names[0]
    path = os.path.join(folder, chosen)
    if not chosen.endswith(".index.json"):
        return path, {}
    try:
        with open(path, encoding="utf-8") as handle:
            weight_map = json.load(handle)["weight_map"]
        files = {key: os.path.join(folder, name) for key, name in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise GaplanError(f"{path}: not a readable weights index ({one_line(exc)})") from None
    for file in sorted(set(files.values())):
        if not os.path.isfile(file):
            raise GaplanError(f"{path} names {os.path.basename(file)}, which is not in {folder}")
    return path, files


def _check_safetensors(file: str) -> None:
    """Read a safetensors file's header (not its data): a corrupted or truncated file fails here, by name."""
    from safetensors import safe_open

    try:
        with safe_open(file, framework="pt") as handle:
            handle.keys()
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types (SafetensorError, ...)
        raise GaplanError(f"{file}: not a valid safetensors file ({one_line(exc)})") from None


def load_pretrained(folder: str, auto_class: str, config: Any, dtype: Any, device: Any,
                    trust_remote_code: bool = False, attention: str | None = None) -> Any:
    """``auto_class.from_pretrained(folder)`` with ``config``, as ``dtype``, onto ``device`` (directly when CUDA).

    The weights must be this config's: a tensor of another shape, or a weight of the model's body
    missing from (or extra in) the files, is a :class:`GaplanError` naming the file. A new task head
    (a classifier on a causal-LM checkpoint) is initialized randomly, as transformers does.
    """
    import torch
    import transformers

    index_or_file, files = _shards(folder)
    for file in sorted(set(files.values()) or {index_or_file}):
        if file.endswith(".safetensors"):
            _check_safetensors(file)
    device = torch.device(device)
    kwargs: dict[str, Any] = {"device_map": {"": device}} if device.type == "cuda" else {}
    if attention:
        kwargs["attn_implementation"] = attention
    auto = getattr(transformers, auto_class)
    try:
        with quiet_transformers():
            model, info = auto.from_pretrained(folder, config=config, dtype=dtype, local_files_only=True,
                                               trust_remote_code=trust_remote_code, ignore_mismatched_sizes=True,
                                               output_loading_info=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - torch.load, safetensors and transformers raise many types
        if isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc):
            raise  # running out of memory is the probe's and the trainer's business, not a bad file
        message = one_line(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise GaplanError(f"cannot load the weights in {index_or_file}: {message}") from None

    def where(key: str) -> str:
        return files.get(key, index_or_file)

    mismatched = sorted(info.get("mismatched_keys") or [])
    if mismatched:
        key, saved, expected = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise GaplanError(f"{where(key)}: {key} has shape {list(saved)} but {folder}/config.json makes it "
                          f"{list(expected)}{more}: the weights do not match the config")
    prefix = getattr(model, "base_model_prefix", "") + "."
    missing = sorted(k for k in info.get("missing_keys") or [] if k.startswith(prefix))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise GaplanError(f"{index_or_file}: has no {missing[0]}{more}, which {folder}/config.json needs: "
                          "the weights do not match the config")
    unexpected = sorted(k for k in info.get("unexpected_keys") or [] if k.startswith(prefix))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise GaplanError(f"{where(unexpected[0])}: has {unexpected[0]}{more}, which {folder}/config.json has no "
                          "place for: the weights do not match the config")
    return model


def _refuse_to_overwrite(out: str, out_dir: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise GaplanError(f"cannot write the model to {out_dir}: it is a file")
    if os.path.isdir(out) and os.listdir(out) and not any(os.path.isfile(os.path.join(out, name))
                                                          for name in ("config.json", "adapter_config.json")):
        raise GaplanError(f"cannot write the model to {out_dir}: it is a folder that holds something other than "
                          "a model (no config.json or adapter_config.json); not overwritten")


def check_save_path(out_dir: str) -> str:
    """Fail now, in one line, if ``save_model(..., out_dir)`` could not write there (before hours of training).

    Checks what can be checked without writing the model: ``out_dir`` is not a file nor a folder of
    other things, and a folder can be made beside it. Returns the absolute path.
    """
    out = os.path.abspath(out_dir)
    _refuse_to_overwrite(out, out_dir)
    probe = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.check.{os.getpid()}")
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        os.mkdir(probe)
    except OSError as exc:
        raise GaplanError(f"cannot write the model to {out_dir}: {exc.strerror or one_line(exc)}") from None
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)
    return out


def save_model(workload: Any, out_dir: str, tokenizer_dir: str | None = None, state_dict: dict | None = None,
               merge: bool = False) -> str:
    """Write ``workload``'s model as a ``save_pretrained`` folder (config, safetensors weights, tokenizer).

    A LoRA model (peft) writes its adapter folder (``adapter_config.json``, the adapter's weights), which
    ``PeftModel.from_pretrained(base, out_dir)`` loads; with ``merge`` the adapters are merged into the base
    (``merge_and_unload``) and the whole model is written, for ``from_pretrained``. The base's own folder is not
    touched either way.

    ``AutoModelFor<task>.from_pretrained(out_dir)`` and ``AutoTokenizer.from_pretrained(out_dir)`` load
    it. The tokenizer comes from ``tokenizer_dir``, else the model's folder when it has tokenizer
    files. The folder is written next to ``out_dir`` under a temp name and renamed into place, so
    ``out_dir`` is the whole model or nothing; an existing ``out_dir`` is replaced only when it is a
    model folder (``config.json``) or empty. Returns the absolute path written.
    """
    from gaplan.workload.lora import is_peft_model

    model = getattr(workload.model, "module", workload.model)  # a DDP wrapper's model
    if merge and is_peft_model(model):
        model, state_dict = model.merge_and_unload(), None  # the full model's weights, adapters added in
    if not hasattr(model, "save_pretrained") or not hasattr(model, "config"):
        raise GaplanError(f"--save-model needs a transformers model; {workload.spec.model} builds a "
                          f"{type(model).__name__}")
    out = os.path.abspath(out_dir)
    _refuse_to_overwrite(out, out_dir)
    if tokenizer_dir is None:
        source = workload.info.get("weights_path") or workload.spec.model
        tokenizer_dir = source if has_tokenizer(source) else None
    parent, name = os.path.dirname(out), os.path.basename(out)
    temp = os.path.join(parent, f".{name}.tmp.{os.getpid()}")
    old = os.path.join(parent, f".{name}.old.{os.getpid()}")
    moved_aside = False
    needed = tensor_bytes(state_dict if state_dict is not None else model.state_dict())
    try:
        os.makedirs(parent, exist_ok=True)
        ensure_room(temp, needed, f"the model folder {name}")  # beside the old folder, which goes only after
        shutil.rmtree(temp, ignore_errors=True)
        os.mkdir(temp)
        with disk_faults_as_one_line(temp, needed, f"the model folder {name}"):
            _write_folder(model, workload, temp, tokenizer_dir, state_dict)
        if os.path.isdir(out):
            os.replace(out, old)
            moved_aside = True
        os.replace(temp, out)
        moved_aside = False
    except OSError as exc:
        raise GaplanError(f"cannot write the model to {out_dir}: {exc.strerror or one_line(exc)}") from None
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        if moved_aside:  # the new folder did not go in: put the old one back
            with contextlib.suppress(OSError):
                os.replace(old, out)
        shutil.rmtree(old, ignore_errors=True)
    return out


def _write_folder(model: Any, workload: Any, folder: str, tokenizer_dir: str | None, state_dict: dict | None) -> None:
    config = model.config
    use_cache = getattr(config, "use_cache", None)
    if use_cache is not None:  # training turned the KV cache off; the saved model is for inference too
        config.use_cache = workload.info.get("use_cache", True)
    try:
        with quiet_transformers():
            model.save_pretrained(folder, state_dict=state_dict)
    finally:
        if use_cache is not None:
            config.use_cache = use_cache
    if tokenizer_dir is None:
        return
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True,
                                                      trust_remote_code=workload.spec.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise GaplanError(f"cannot load the tokenizer in {tokenizer_dir} to save it: "
                          f"{one_line(str(exc).splitlines()[0] if str(exc) else exc)}") from None
    with quiet_transformers():
        tokenizer.save_pretrained(folder)
