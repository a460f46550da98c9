"""Training data: a built-in learnable synthetic corpus, or real text data, and padded batches.

* :mod:`~gaplan.data.readers` — raw records from a text file, JSONL, a ``datasets`` folder or parquet;
* :mod:`~gaplan.data.tokenizer` — the model's tokenizer, explicit bytes, or another folder; pad and mask ids;
* :mod:`~gaplan.data.corpus` — :class:`SyntheticCorpus`, :class:`TextCorpus` and :func:`load_corpus`,
  which reads and checks the data before any model runs;
* :mod:`~gaplan.data.batches` — :func:`step_indices` (a seeded permutation per epoch) and :func:`collate`;
* :mod:`~gaplan.data.plan_sampler` — :class:`PlanBatchSampler`, a plan's micro-batches (uneven too) as a DataLoader's
  ``batch_sampler``.

Samples are addressed by index, and optimizer step ``s`` always takes the same samples, so a resumed
run sees exactly the data an uninterrupted one would.
"""

from gaplan.core.lazy import lazy_exports

_EXPORTS = {
    "BYTES": ".tokenizer",
    "CorpusStats": ".corpus",
    "LONG_SAMPLES": ".corpus",
    "PAD_ID": ".batches",
    "Record": ".readers",
    "Sample": ".corpus",
    "SyntheticCorpus": ".corpus",
    "TOKENIZER_FILES": ".tokenizer",
    "TextCorpus": ".corpus",
    "Tokenizer": ".tokenizer",
    "byte_tokenizer": ".tokenizer",
    "collate": ".batches",
    "data_format": ".readers",
    "has_tokenizer": ".tokenizer",
    "load_corpus": ".corpus",
    "load_tokenizer": ".tokenizer",
    "PlanBatchSampler": ".plan_sampler",
    "permuted_index": ".batches",
    "permuted_indices": ".batches",
    "read_records": ".readers",
    "step_indices": ".batches",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
