"""Raw records from every ``--data`` format, and each bad input as one line."""

import sys

import pytest

from gaplan.core.errors import GaplanError
from gaplan.data import data_format, read_records

from .conftest import LABELS, TEXTS

FORMATS = ("text", "jsonl", "datasets", "dataset_dict", "parquet")


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(GaplanError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("kind", FORMATS)
def test_every_format_reads_the_same_texts_in_order(data_files, kind):
    records = read_records(data_files[kind])
    assert [r.text for r in records] == TEXTS
    assert all(r.label is None for r in records)  # labels only when asked for


def test_the_format_follows_the_path(data_files):
    assert [data_format(data_files[k]) for k in FORMATS] == ["text", "jsonl", "datasets", "datasets", "parquet"]


def test_records_say_where_they_come_from(data_files):
    assert [r.where for r in read_records(data_files["text"])][2:4] == ["line 3", "line 6"]  # blank lines 4-5 skipped
    assert read_records(data_files["parquet"])[1].where == "row 1"


@pytest.mark.parametrize("kind", ("jsonl", "datasets", "dataset_dict", "parquet"))
def test_labels_are_read_from_the_label_field(data_files, kind):
    assert [r.label for r in read_records(data_files[kind], label_field="label")] == LABELS


@pytest.mark.parametrize("kind", ("jsonl", "datasets", "parquet"))
def test_another_text_field(data_files, kind):
    # 'id' holds integers, not text: an error naming the record, not a silent str()
    message = one_line_error(read_records, data_files[kind], text_field="id")
    assert "'id' is a number, not a string" in message and ("line 1" in message or "row 0" in message)


def test_a_null_text_is_named_as_the_file_has_it(tmp_path):
    path = tmp_path / "null.jsonl"
    path.write_text('{"text": null}\n')
    assert "line 1: 'text' is null, not a string" in one_line_error(read_records, str(path))


def test_a_dataset_dict_takes_train_else_its_only_split_else_says_which_exist(tmp_path):
    import datasets

    datasets.disable_progress_bars()
    one = datasets.Dataset.from_dict({"text": ["x y"]})
    datasets.DatasetDict({"validation": one}).save_to_disk(str(tmp_path / "single"))
    assert [r.text for r in read_records(str(tmp_path / "single"))] == ["x y"]
    two = datasets.Dataset.from_dict({"text": ["u v", "w z"]})
    datasets.DatasetDict({"validation": one, "test": two}).save_to_disk(str(tmp_path / "many"))
    message = one_line_error(read_records, str(tmp_path / "many"))
    assert "validation, test" in message and "'train'" in message
    suggested = message.split("--data ")[-1].split(" ")[0]
    assert [r.text for r in read_records(suggested)] == ["x y"]  # the path it suggests is readable as is


@pytest.mark.parametrize("kind", ("datasets", "parquet"))
def test_a_missing_text_field_lists_the_columns_that_exist(data_files, kind):
    message = one_line_error(read_records, data_files[kind], text_field="content")
    assert "no column 'content'" in message and "text, label, id" in message and "--text-field" in message
    message = one_line_error(read_records, data_files[kind], label_field="sentiment")
    assert "no column 'sentiment'" in message and "--label-field" in message


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n\n{"body": "no text"}\n', encoding="utf-8")
    message = one_line_error(read_records, str(path))
    assert "line 3 is not a JSON object with a 'text' field" in message and "it has: body" in message
    path.write_text('{"text": "fine"}\n[1, 2]\n', encoding="utf-8")
    assert "line 2 is not a JSON object" in one_line_error(read_records, str(path))
    path.write_text('{"text": "fine"}\n{"text": \n', encoding="utf-8")
    assert "line 2 is not JSON" in one_line_error(read_records, str(path))
    path.write_text('{"text": "fine"}\n', encoding="utf-8")
    assert "line 1 has no 'label' field" in one_line_error(read_records, str(path), label_field="label")


def test_a_text_file_has_no_labels_for_classification(data_files):
    assert "a text file has no 'label' field (--label-field)" in one_line_error(read_records, data_files["text"],
                                                                              label_field="label")


def test_unreadable_data_is_one_line(tmp_path):
    assert "cannot read it" in one_line_error(read_records, str(tmp_path / "nope.txt"))
    (tmp_path / "empty_folder").mkdir()
    assert "not a datasets folder made with save_to_disk" in one_line_error(read_records, str(tmp_path / "empty_folder"))
    (tmp_path / "fake.parquet").write_bytes(b"not parquet")
    assert "cannot read it as parquet" in one_line_error(read_records, str(tmp_path / "fake.parquet"))


@pytest.mark.parametrize("kind,modules", [("datasets", ("datasets",)), ("parquet", ("pyarrow", "pyarrow.parquet"))])
def test_without_the_datasets_extra_the_error_names_it(data_files, monkeypatch, kind, modules):
    """The packages are installed here, so their absence is a stand-in: ``None`` in ``sys.modules`` makes
    ``import datasets`` (or pyarrow) raise ImportError exactly as on a machine without the extra."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)
    path = data_files[kind]
    assert one_line_error(read_records, path) == f'reading {path} needs the datasets extra: pip install "gaplan[data]"'
