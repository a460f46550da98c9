"""The data's token lengths are cached per data file and tokenizer: a second read tokenizes nothing."""

import os

import pytest

from gaplan.core.errors import GaplanError
from gaplan.data import Tokenizer
from gaplan.data.lengths import LENGTHS_DIR
from gaplan.data.source import DataSource
from gaplan.workflows.train_data import read_data_lengths
from gaplan.workload.spec import WorkloadSpec
from tests.token_corpus import long_tailed_lines

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=32)


@pytest.fixture
def encoded(monkeypatch, tmp_path):
    """Counts the texts the tokenizer encodes; the cache in a folder of its own."""
    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    texts = []
    encode = Tokenizer.encode

    def counting(self, batch):
        texts.extend(batch)
        return encode(self, batch)

    monkeypatch.setattr(Tokenizer, "encode", counting)
    return texts


def lengths(data, **options):
    return read_data_lengths(SPEC, DataSource(path=str(data), tokenizer="bytes", **options), lambda text: None)


def test_a_second_read_hits_the_cache_and_a_changed_file_misses_it(tmp_path, encoded):
    data = tmp_path / "corpus.txt"
    lines = long_tailed_lines(50, 8, 40)
    data.write_text("\n".join(lines) + "\n")
    first = lengths(data)
    assert len(encoded) == 50 and not first.cached
    # Byte tokens, seq len 32: a longer line is split into 32 tokens and the rest (dropped under 2 tokens).
    assert first.lengths == [n for line in lines for n in
                             ([len(line)] if len(line) <= 32 else [32] + [len(line) - 32] * (len(line) > 33))]
    assert len(os.listdir(tmp_path / "cache" / LENGTHS_DIR)) == 1
    second = lengths(data)
    assert len(encoded) == 50 and second.cached  # nothing tokenized
    assert (second.lengths, second.stats, second.tokenizer) == (first.lengths, first.stats, first.tokenizer)
    assert "(lengths from the cache)" in second.describe()
    # Another sequence length cuts the samples otherwise: another key.
    assert not lengths(data, long_samples="truncate").cached and len(encoded) == 100
    # The file changes (size and modification time): read again, and the new lengths are the file's.
    data.write_text("\n".join(lines + ["one more line"]) + "\n")
    changed = lengths(data)
    assert not changed.cached and len(encoded) == 151 and changed.lengths[-1] == len("one more line")
    assert lengths(data).cached and len(encoded) == 151


def test_an_unreadable_cache_file_is_read_again_and_a_missing_file_is_a_one_line_error(tmp_path, encoded):
    data = tmp_path / "corpus.txt"
    data.write_text("a first line\nand a second one\n")
    lengths(data)
    (cache_file,) = (tmp_path / "cache" / LENGTHS_DIR).iterdir()
    cache_file.write_text("{cut off")
    again = lengths(data)
    assert not again.cached and again.lengths == [12, 16] and lengths(data).cached
    with pytest.raises(GaplanError, match="no such file or folder"):
        lengths(tmp_path / "missing.txt")
