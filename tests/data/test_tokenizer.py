"""The tokenizer: the model folder's own, explicit bytes, or another folder; never a silent fallback."""

import pytest

from gaplan.core.errors import GaplanError
from gaplan.core.tasks import CAUSAL_LM, MASKED_LM
from gaplan.data import BYTES, load_corpus, load_tokenizer

from .conftest import make_model_dir, make_tokenizer_dir
from .test_readers import one_line_error


def test_the_model_folders_own_tokenizer_with_its_pad_and_mask_ids(tmp_path):
    from transformers import AutoTokenizer

    model_dir = make_model_dir(tmp_path / "model", vocab_size=120, with_tokenizer=True)
    tokenizer = load_tokenizer(model_dir)
    reference = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert tokenizer.size == len(reference) == 120
    assert (tokenizer.pad_id, tokenizer.mask_id) == (reference.pad_token_id, reference.mask_token_id) == (0, 4)
    assert tokenizer.encode(["the lazy dog"]) == [reference("the lazy dog")["input_ids"]]
    assert tokenizer.name.startswith(model_dir) and not tokenizer.is_bytes


def test_a_tokenizer_folder_given_explicitly_wins_over_the_models(tmp_path, tokenizer_dir):
    model_dir = make_model_dir(tmp_path / "model", vocab_size=300)
    assert load_tokenizer(model_dir, tokenizer_dir).name.startswith(tokenizer_dir)
    assert load_tokenizer(None, tokenizer_dir).size == 120


def test_bytes_only_when_asked_for(tmp_path):
    tokenizer = load_tokenizer(make_model_dir(tmp_path / "model", vocab_size=300), BYTES)
    assert tokenizer.is_bytes and tokenizer.name == "bytes"
    assert tokenizer.encode(["aé"]) == [[1 + 97, 1 + 0xC3, 1 + 0xA9]]
    assert (tokenizer.size, tokenizer.pad_id, tokenizer.mask_id) == (257, 0, 257)


def test_a_model_folder_without_tokenizer_files_is_an_error_suggesting_bytes(tmp_path):
    model_dir = make_model_dir(tmp_path / "model", vocab_size=300)
    message = one_line_error(load_tokenizer, model_dir, None)
    assert f"the model folder {model_dir} has no tokenizer files" in message and "--tokenizer bytes" in message
    assert "--tokenizer bytes" in one_line_error(load_tokenizer, None, None)  # a preset has no folder at all


def test_a_tokenizer_path_that_is_not_a_tokenizer_folder(tmp_path):
    assert "no such folder" in one_line_error(load_tokenizer, None, str(tmp_path / "nope"))
    assert "no tokenizer files in it" in one_line_error(load_tokenizer, None, str(tmp_path))


def test_a_broken_tokenizer_is_an_error_with_the_reason(tmp_path):
    model_dir = make_model_dir(tmp_path / "model", vocab_size=300)
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    message = one_line_error(load_tokenizer, model_dir)
    assert message.startswith(f"the tokenizer in {model_dir} cannot be loaded (") and message.endswith(")")


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_reading(tmp_path, tokenizer_dir):
    data = tmp_path / "corpus.txt"
    data.write_text("the quick brown fox\n", encoding="utf-8")
    unread = tmp_path / "bad.jsonl"
    unread.write_text("not json\n", encoding="utf-8")  # it would be an error too, but the tokenizer comes first
    message = one_line_error(load_corpus, str(unread), seq_len=16, vocab_size=100, tokenizer_choice=tokenizer_dir)
    assert "has 120 tokens but the model's vocab_size is 100" in message
    assert len(load_corpus(str(data), seq_len=16, vocab_size=120, tokenizer_choice=tokenizer_dir)) == 1  # equal fits
    message = one_line_error(load_corpus, str(data), seq_len=16, vocab_size=256, tokenizer_choice=BYTES)
    assert "byte-level tokenizer needs a vocabulary of 257 or more (the model has 256)" in message


def test_masked_lm_needs_a_mask_token(tmp_path, tokenizer_dir):
    data = tmp_path / "corpus.txt"
    data.write_text("the quick brown fox\n", encoding="utf-8")
    no_mask = make_tokenizer_dir(tmp_path / "no-mask", mask_token=None, specials=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    assert load_tokenizer(None, no_mask).mask_id is None
    message = one_line_error(load_corpus, str(data), seq_len=16, vocab_size=200, task=MASKED_LM,
                             tokenizer_choice=no_mask)
    assert "masked LM needs a mask token" in message and "has none" in message
    assert load_corpus(str(data), seq_len=16, vocab_size=200, task=CAUSAL_LM, tokenizer_choice=no_mask).mask_id is None
    assert load_corpus(str(data), seq_len=16, vocab_size=200, task=MASKED_LM, tokenizer_choice=tokenizer_dir).mask_id == 4
    # bytes: 257 ids for causal LM, and one more for the mask id
    with pytest.raises(GaplanError, match="vocabulary of 258 or more"):
        load_corpus(str(data), seq_len=16, vocab_size=257, task=MASKED_LM, tokenizer_choice=BYTES)
    assert load_corpus(str(data), seq_len=16, vocab_size=258, task=MASKED_LM, tokenizer_choice=BYTES).mask_id == 257
