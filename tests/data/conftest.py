"""Real data and a real tokenizer, built offline: nothing is downloaded.

The tokenizer is a WordPiece model trained with the ``tokenizers`` library on a few lines and saved
with ``PreTrainedTokenizerFast.save_pretrained``, so ``AutoTokenizer`` loads it as it would a
checkpoint's. The same texts are written as a text file, JSONL, a ``datasets`` folder, a DatasetDict
folder and a parquet file.
"""

import json

import pytest

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "alpha beta gamma delta", "zebra 42",
         "a much longer line that goes on and on past the sequence length of the tests",
         "ünïcode line too"]
LABELS = [0, 1, 2, 1, 0, 2]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tokenizer_dir(path, mask_token: str | None = "[MASK]", specials=SPECIALS):
    """A WordPiece tokenizer trained on TEXTS (with [CLS] ... [SEP] around each text), saved at ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(TEXTS * 3, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=specials, show_progress=False))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", cls), ("[SEP]", sep)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                      mask_token=mask_token)
    wrapped.save_pretrained(str(path))
    return str(path)


def make_model_dir(path, vocab_size: int, with_tokenizer: bool = False) -> str:
    """A model folder: a tiny GPT-2 config (no weights needed to read data), optionally with the tokenizer."""
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=vocab_size, n_positions=64, bos_token_id=0,
               eos_token_id=0).save_pretrained(str(path))
    if with_tokenizer:
        make_tokenizer_dir(path)
    return str(path)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def data_files(tmp_path_factory):
    """The same TEXTS/LABELS in every format: {'text', 'jsonl', 'datasets', 'dataset_dict', 'parquet'} -> path."""
    import datasets

    datasets.disable_progress_bars()
    root = tmp_path_factory.mktemp("data")
    (root / "corpus.txt").write_text("\n".join(TEXTS[:3]) + "\n\n  \n" + "\n".join(TEXTS[3:]) + "\n",
                                     encoding="utf-8")  # blank lines are skipped
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": y, "id": n}) + "\n" for n, (t, y) in enumerate(zip(TEXTS, LABELS, strict=True)))
        + "\n", encoding="utf-8")
    table = datasets.Dataset.from_dict({"text": TEXTS, "label": LABELS, "id": list(range(len(TEXTS)))})
    table.save_to_disk(str(root / "folder"))
    other = datasets.Dataset.from_dict({"text": ["held out text"], "label": [0], "id": [99]})
    datasets.DatasetDict({"test": other, "train": table}).save_to_disk(str(root / "dict"))
    table.to_parquet(str(root / "corpus.parquet"))
    return {"text": str(root / "corpus.txt"), "jsonl": str(root / "corpus.jsonl"), "datasets": str(root / "folder"),
            "dataset_dict": str(root / "dict"), "parquet": str(root / "corpus.parquet")}
