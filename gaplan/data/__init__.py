"""Training data: a built-in learnable synthetic corpus, or real text data, and padded batches.

* :mod:`~gaplan.data.readers` — raw records from a text file, JSONL, a ``datasets`` folder or parquet;
* :mod:`~gaplan.data.tokenizer` — the model's tokenizer, explicit bytes, or another folder; pad and mask ids;
* :mod:`~gaplan.data.corpus` — :class:`SyntheticCorpus`, :class:`TextCorpus` and :func:`load_corpus`,
  which reads and checks the data before any model runs;
* :mod:`~gaplan.data.batches` — :func:`step_indices` (a seeded permutation per epoch) and :func:`collate`.

Samples are addressed by index, and optimizer step ``s`` always takes the same samples, so a resumed
run sees exactly the data an uninterrupted one would.
"""

from gaplan.data.batches import PAD_ID, collate, permuted_index, permuted_indices, step_indices
from gaplan.data.corpus import LONG_SAMPLES, CorpusStats, Sample, SyntheticCorpus, TextCorpus, load_corpus
from gaplan.data.readers import Record, data_format, read_records
from gaplan.data.tokenizer import BYTES, TOKENIZER_FILES, Tokenizer, byte_tokenizer, has_tokenizer, load_tokenizer

__all__ = ["BYTES", "LONG_SAMPLES", "PAD_ID", "TOKENIZER_FILES", "CorpusStats", "Record", "Sample",
           "SyntheticCorpus", "TextCorpus", "Tokenizer", "byte_tokenizer", "collate", "data_format",
           "has_tokenizer", "load_corpus", "load_tokenizer", "permuted_index", "permuted_indices", "read_records", "step_indices"]
