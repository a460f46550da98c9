"""Raw records from ``--data``: a text file, JSONL, a Hugging Face ``datasets`` folder, or a parquet file.

Which format is decided by the path: a folder is a ``datasets`` folder (``save_to_disk``), ``.parquet``
is parquet, ``.jsonl``/``.json`` is JSON lines, anything else is text with one sample per line (blank
lines skipped). The folder and parquet readers need the optional ``datasets`` extra, imported only
when such data is read. Nothing is tokenized here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gaplan.core.errors import GaplanError, one_line

DATA_EXTRA = 'pip install "gaplan[data]"'


@dataclass(frozen=True)
class Record:
    """One raw sample: its text, its label (``None`` unless a label field was read) and where it came from.

    ``where`` names the record in error messages: ``line N`` (1-based) in text and JSONL files,
    ``row N`` (0-based, as ``dataset[N]``) in datasets folders and parquet files.
    """

    text: str
    label: Any = None
    where: str = ""


def data_format(path: str) -> str:
    """``datasets``, ``parquet``, ``jsonl`` or ``text``: how :func:`read_records` reads ``path``."""
    if os.path.isdir(path):
        return "datasets"
    if path.endswith(".parquet"):
        return "parquet"
    if path.endswith((".jsonl", ".json")):
        return "jsonl"
    return "text"


def read_records(path: str, text_field: str = "text", label_field: str | None = None,
                 label_option: str = "--label-field") -> list[Record]:
    """Every record of ``path``, with its ``label_field`` when given (classification's label, seq2seq's target, named
    ``label_option`` in the messages), else no label.

    Raises :class:`GaplanError` with one line for anything wrong with the data: unreadable, a JSONL
    line that is not an object with the field (naming the line), a folder or parquet file without the
    field (listing the columns it has), a ``datasets`` folder with several splits and none ``train``,
    or the ``datasets`` extra missing.
    """
    kind = data_format(path)
    if kind == "datasets":
        return _read_dataset_folder(path, text_field, label_field, label_option)
    if kind == "parquet":
        return _read_parquet(path, text_field, label_field, label_option)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise GaplanError(f"--data {path}: cannot read it ({exc.__class__.__name__}: {one_line(exc)})") from None
    if kind == "text":
        if label_field is not None:
            raise GaplanError(f"--data {path}: a text file has no '{label_field}' field ({label_option}); give JSONL, "
                              f"a datasets folder or a parquet file with one")
        return [Record(line, None, f"line {n}") for n, line in enumerate(lines, 1) if line.strip()]
    return [_json_record(line, path, n, text_field, label_field, label_option)
            for n, line in enumerate(lines, 1) if line.strip()]


def _json_record(line: str, path: str, number: int, text_field: str, label_field: str | None,
                 label_option: str) -> Record:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise GaplanError(f"--data {path}: line {number} is not JSON ({one_line(exc)})") from None
    if not isinstance(record, dict) or text_field not in record:
        raise GaplanError(f"--data {path}: line {number} is not a JSON object with a '{text_field}' field"
                          + (f" (it has: {', '.join(map(str, record))})" if isinstance(record, dict) else ""))
    text = record[text_field]
    if not isinstance(text, str):
        raise GaplanError(f"--data {path}: line {number}: '{text_field}' is {_json_kind(text)}, not a string")
    if label_field is None:
        return Record(text, None, f"line {number}")
    if label_field not in record:
        raise GaplanError(f"--data {path}: line {number} has no '{label_field}' field ({label_option} names it; "
                          f"it has: {', '.join(map(str, record))})")
    return Record(text, record[label_field], f"line {number}")


def _columns(path: str, available: list[str], text_field: str, label_field: str | None,
             label_option: str) -> list[str]:
    wanted = [text_field] + ([label_field] if label_field is not None else [])
    for field, option in zip(wanted, ("--text-field", label_option), strict=False):
        if field not in available:
            raise GaplanError(f"--data {path} has no column '{field}' (its columns: {', '.join(available)}); "
                              f"name the one to use with {option}")
    return wanted


def _rows(path: str, columns: dict[str, list], text_field: str, label_field: str | None) -> list[Record]:
    texts = columns[text_field]
    labels = columns[label_field] if label_field is not None else [None] * len(texts)
    records = []
    for row, (text, label) in enumerate(zip(texts, labels, strict=True)):
        if not isinstance(text, str):
            raise GaplanError(f"--data {path}: row {row}: '{text_field}' is {_json_kind(text)}, not a string")
        records.append(Record(text, label, f"row {row}"))
    return records


@contextmanager
def _quiet_datasets(datasets: Any) -> Iterator[None]:
    """Reading is a library call: no progress bars on the user's terminal (restored afterwards)."""
    utils = datasets.utils
    was_disabled = utils.are_progress_bars_disabled()
    utils.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            utils.enable_progress_bars()


def _read_dataset_folder(path: str, text_field: str, label_field: str | None, label_option: str) -> list[Record]:
    try:
        import datasets
    except ImportError:
        raise GaplanError(f"reading {path} needs the datasets extra: {DATA_EXTRA}") from None
    with _quiet_datasets(datasets):
        try:
            loaded = datasets.load_from_disk(path)
        except Exception as exc:  # noqa: BLE001 - any failure here is the user's folder, said in one line
            raise GaplanError(f"--data {path}: not a datasets folder made with save_to_disk "
                              f"({exc.__class__.__name__}: {one_line(exc)})") from None
        if isinstance(loaded, datasets.DatasetDict):
            splits = list(loaded)
            if "train" in loaded:
                loaded = loaded["train"]
            elif len(splits) == 1:
                loaded = loaded[splits[0]]
            else:
                raise GaplanError(f"--data {path} holds the splits {', '.join(splits)} and none is 'train': "
                                  f"give the one to train on as --data {os.path.join(path, splits[0])} (or another)")
        wanted = _columns(path, list(loaded.column_names), text_field, label_field, label_option)
        return _rows(path, loaded.select_columns(wanted).to_dict(), text_field, label_field)


def _read_parquet(path: str, text_field: str, label_field: str | None, label_option: str) -> list[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise GaplanError(f"reading {path} needs the datasets extra: {DATA_EXTRA}") from None
    try:
        names = list(pq.read_schema(path).names)
        wanted = _columns(path, names, text_field, label_field, label_option)
        table = pq.read_table(path, columns=wanted)
    except GaplanError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable or not parquet: one line with the reason
        raise GaplanError(f"--data {path}: cannot read it as parquet ({exc.__class__.__name__}: {one_line(exc)})") \
            from None
    return _rows(path, table.to_pydict(), text_field, label_field)


def _json_kind(value: object) -> str:
    """A JSON value's kind as the file says it (null, a number, an array), not Python's type name."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}.get(
        type(value), type(value).__name__)
