"""Text corpora: the same samples from every format, long samples split or truncated and counted, labels checked."""

import json

import pytest

from gaplan.core.errors import GaplanError
from gaplan.core.tasks import CAUSAL_LM, CLASSIFICATION, IGNORE_INDEX, MASKED_LM
from gaplan.data import BYTES, CorpusStats, TextCorpus, collate, load_corpus, load_tokenizer, step_indices

from .conftest import LABELS, TEXTS, make_model_dir
from .test_readers import FORMATS, one_line_error


@pytest.mark.parametrize("task", (CAUSAL_LM, CLASSIFICATION))
def test_every_format_gives_the_same_samples(data_files, tokenizer_dir, task):
    kinds = FORMATS if task == CAUSAL_LM else FORMATS[1:]  # a text file has no labels
    corpora = [load_corpus(data_files[k], seq_len=64, vocab_size=120, task=task, num_labels=3,
                           tokenizer_choice=tokenizer_dir) for k in kinds]
    tokenizer = load_tokenizer(None, tokenizer_dir)
    expected = [tuple(ids) for ids in tokenizer.encode(TEXTS)]
    for corpus in corpora:
        assert [s.ids for s in corpus.samples] == expected
        assert [s.label for s in corpus.samples] == (LABELS if task == CLASSIFICATION else [0] * len(TEXTS))
        assert corpus.stats == CorpusStats(read=len(TEXTS), samples=len(TEXTS))


def test_long_samples_are_split_by_default_and_every_piece_counted(tmp_path):
    path = tmp_path / "lengths.txt"
    # byte tokens, seq_len 8: 20 -> 8+8+4; 17 -> 8+8 and a 1-token tail dropped; 8 fits; 1 is too short
    path.write_text("\n".join(["a" * 20, "b" * 17, "c" * 8, "d", "ef"]) + "\n", encoding="utf-8")
    split = load_corpus(str(path), seq_len=8, vocab_size=300, tokenizer_choice=BYTES)
    assert [len(s.ids) for s in split.samples] == [8, 8, 4, 8, 8, 8, 2]
    assert split.stats == CorpusStats(read=5, samples=7, split=2, chunks=5, short_tails=1, too_short=1)
    assert split.stats.describe() == ("7 samples from 5 records (2 split into 5, 1 final pieces under 2 tokens "
                                      "dropped; 1 under 2 tokens dropped)")
    assert b"".join(bytes(t - 1 for t in s.ids) for s in split.samples[:3]) == b"a" * 20  # in order, nothing lost
    truncated = load_corpus(str(path), seq_len=8, vocab_size=300, tokenizer_choice=BYTES, long_samples="truncate")
    assert [len(s.ids) for s in truncated.samples] == [8, 8, 8, 2]
    assert truncated.stats == CorpusStats(read=5, samples=4, truncated=2, too_short=1)
    assert truncated.stats.describe() == "4 samples from 5 records (2 truncated; 1 under 2 tokens dropped)"
    assert truncated.describe() == f"data: {truncated.stats.describe()} in {path}, tokenizer bytes"
    assert "split or truncate" in one_line_error(load_corpus, str(path), seq_len=8, vocab_size=300,
                                                 tokenizer_choice=BYTES, long_samples="drop")


def test_a_split_classification_sample_keeps_its_label_in_every_chunk(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": "x" * 10, "label": 2}) + "\n", encoding="utf-8")
    corpus = load_corpus(str(path), seq_len=4, vocab_size=300, task=CLASSIFICATION, num_labels=3,
                         tokenizer_choice=BYTES)
    assert [(len(s.ids), s.label) for s in corpus.samples] == [(4, 2), (4, 2), (2, 2)]


@pytest.mark.parametrize("label,problem", [(3, "the label 3 is outside 0..2 (num_labels 3)"),
                                           (-1, "the label -1 is outside 0..2"),
                                           ("positive", "the label 'positive' is not an integer class index"),
                                           (1.5, "the label 1.5 is not an integer"),
                                           (True, "the label True is not an integer"),
                                           (None, "the label None is not an integer")])
def test_a_bad_label_is_an_error_naming_the_record(tmp_path, label, problem):
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"text": "fine text", "label": 0}) + "\n"
                    + json.dumps({"text": "bad label", "label": label}) + "\n", encoding="utf-8")
    message = one_line_error(load_corpus, str(path), seq_len=16, vocab_size=300, task=CLASSIFICATION, num_labels=3,
                             tokenizer_choice=BYTES)
    assert message == f"--data {path}: line 2: {problem}" or message.startswith(f"--data {path}: line 2: {problem}")


def test_labels_out_of_range_in_a_datasets_folder_name_the_row(data_files, tokenizer_dir):
    message = one_line_error(load_corpus, data_files["datasets"], seq_len=64, vocab_size=120, task=CLASSIFICATION,
                             num_labels=2, tokenizer_choice=tokenizer_dir)
    assert message == f"--data {data_files['datasets']}: row 2: the label 2 is outside 0..1 (num_labels 2)"
    integral = load_corpus(data_files["datasets"], seq_len=64, vocab_size=120, task=CLASSIFICATION, num_labels=3,
                           tokenizer_choice=tokenizer_dir)
    assert [s.label for s in integral.samples] == LABELS


def test_missing_data_is_said_before_anything_about_the_tokenizer(tmp_path):
    message = one_line_error(load_corpus, str(tmp_path / "nope.txt"), seq_len=8, vocab_size=300)
    assert message == f"--data {tmp_path / 'nope.txt'}: cannot read it (no such file or folder)"


def test_no_usable_text_is_an_error_when_read(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    assert "no text in it" in one_line_error(load_corpus, str(empty), seq_len=8, vocab_size=300,
                                             tokenizer_choice=BYTES)
    short = tmp_path / "short.txt"
    short.write_text("a\nb\n", encoding="utf-8")
    assert "every sample is shorter than 2 tokens" in one_line_error(load_corpus, str(short), seq_len=8,
                                                                     vocab_size=300, tokenizer_choice=BYTES)


def test_batches_pad_and_mask_with_the_tokenizers_ids(data_files, tmp_path):
    from .conftest import make_tokenizer_dir

    # a tokenizer whose [PAD] is 3 and [MASK] 1: distinct from the synthetic defaults (0 and 3)
    odd = make_tokenizer_dir(tmp_path / "odd", specials=["[UNK]", "[MASK]", "[CLS]", "[PAD]", "[SEP]"])
    corpus = load_corpus(data_files["text"], seq_len=64, vocab_size=120, task=MASKED_LM, tokenizer_choice=odd)
    assert (corpus.pad_id, corpus.mask_id) == (3, 1)
    samples = [corpus[i] for i in step_indices(0, 4, len(corpus), seed=0)]
    batch = collate(samples, MASKED_LM, seed=0, mask_id=corpus.mask_id, pad_id=corpus.pad_id)
    padded = batch["attention_mask"] == 0
    assert padded.any() and (batch["input_ids"][padded] == 3).all()
    masked = batch["labels"] != IGNORE_INDEX
    assert masked.any() and (batch["input_ids"][masked] == 1).all()
    causal = collate(samples, CAUSAL_LM, pad_id=corpus.pad_id)
    assert (causal["input_ids"][padded] == 3).all() and (causal["labels"][padded] == IGNORE_INDEX).all()


def test_the_older_constructor_still_reads_a_file_with_bytes_when_the_model_has_no_tokenizer(tmp_path, data_files):
    model_dir = make_model_dir(tmp_path / "model", vocab_size=300)
    corpus = TextCorpus(data_files["jsonl"], 128, 300, model_dir)
    assert corpus.tokenizer == "bytes (the model has no tokenizer files)"
    assert sorted(bytes(t - 1 for t in s.ids).decode("utf-8") for s in corpus.samples) == sorted(TEXTS)
    assert TextCorpus(data_files["text"], 64, 300).tokenizer == "bytes"
    with_tokenizer = make_model_dir(tmp_path / "model2", vocab_size=120, with_tokenizer=True)
    assert TextCorpus(data_files["text"], 64, 120, with_tokenizer).tokenizer.startswith(with_tokenizer)
    with pytest.raises(GaplanError, match="has 120 tokens but the model's vocab_size is 100"):
        TextCorpus(data_files["text"], 64, 100, with_tokenizer)  # no raw IndexError later


def test_a_data_source_gives_the_flags_that_give_it_again():
    from click.testing import CliRunner

    from gaplan.cli.main import main
    from gaplan.data.source import DataSource

    source = DataSource(path="c.jsonl", text_field="body", tokenizer="bytes")
    assert source.flags() == ["--data", "c.jsonl", "--text-field", "body", "--tokenizer", "bytes"]
    assert DataSource().flags() == []
    printed = CliRunner().invoke(main, ["train", *source.flags(), "--print-config"])  # each flag is train's own
    assert printed.exit_code == 0 and 'data = "c.jsonl"' in printed.stdout and 'text-field = "body"' in printed.stdout
