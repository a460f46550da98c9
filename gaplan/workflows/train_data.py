"""The training data of a run, read as ``gaplan train`` reads it: checked against the model, and its samples'
lengths cached (:mod:`gaplan.data.lengths`) so a token probe of the same data needs no second read."""

from __future__ import annotations

import os
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.core.outputs import check_path_exists
from gaplan.core.progress import Say
from gaplan.data.source import DataSource
from gaplan.workload.spec import WorkloadSpec, model_source_kind


def read_training_data(spec: WorkloadSpec, source: DataSource, say: Say):
    """``--data`` read and checked (tokenizer against vocab_size, labels, lengths); None without ``--data``.

    The samples' lengths are written to the length cache (:mod:`gaplan.data.lengths`) on the way.
    """
    from gaplan.data import load_corpus
    from gaplan.data.lengths import DataLengths, save_lengths
    from gaplan.workload.build import model_shape
    from gaplan.workload.seq2seq import target_length

    if not source.path:
        source.check_applies(None)
        return None
    _check_data_applies(spec)
    task, seq_len, vocab_size, num_labels = model_shape(spec)
    source.check_applies(task)
    corpus = load_corpus(source.path, seq_len=seq_len, vocab_size=vocab_size, task=task, num_labels=num_labels,
                         tokenizer_dir=_tokenizer_dir(spec), tokenizer_choice=source.tokenizer,
                         text_field=source.text_name, label_field=source.label_name,
                         long_samples=source.long_sample_rule, trust_remote_code=spec.trust_remote_code,
                         target_len=target_length(spec, task, seq_len), target_field=source.target_name)
    say(corpus.describe())
    save_lengths(_lengths_cache(spec, source, task, seq_len),
                 DataLengths([len(sample.ids) for sample in corpus.samples], corpus.stats, corpus.tokenizer,
                             source.path))
    return corpus


def read_data_lengths(spec: WorkloadSpec, source: DataSource, say: Say):
    """The token lengths of ``--data``'s samples (:class:`gaplan.data.lengths.DataLengths`), from the length cache
    when this data file, tokenizer and options were read before, else read (and tokenized) as
    :func:`read_training_data` reads them, and cached."""
    from gaplan.data import load_tokenizer
    from gaplan.data.lengths import DataLengths, load_lengths
    from gaplan.workload.build import model_shape

    _check_data_applies(spec)
    check_path_exists(source.path, "--data")  # as load_corpus says it, before anything is looked up
    task, seq_len, vocab_size, _ = model_shape(spec)
    source.check_applies(task)
    cached = load_lengths(_lengths_cache(spec, source, task, seq_len), source.path)
    if cached is None:
        corpus = read_training_data(spec, source, say)
        return DataLengths([len(sample.ids) for sample in corpus.samples], corpus.stats, corpus.tokenizer, source.path)
    # The tokenizer still loads and is checked against this model's vocabulary (the key does not hold the model).
    load_tokenizer(_tokenizer_dir(spec), source.tokenizer, spec.trust_remote_code).check_fits(vocab_size, task)
    say(cached.describe())
    return cached


def _check_data_applies(spec: WorkloadSpec) -> None:
    if model_source_kind(spec.model) == "function":
        raise GaplanError("--data does not apply to a module:function model (its function makes the batches)")


def _tokenizer_dir(spec: WorkloadSpec) -> str | None:
    return spec.model if os.path.isdir(spec.model) else None


def _lengths_cache(spec: WorkloadSpec, source: DataSource, task: str, seq_len: int) -> str:
    from gaplan.data.lengths import lengths_cache_path

    return lengths_cache_path(source.path, seq_len=seq_len, task=task, tokenizer_dir=_tokenizer_dir(spec),
                              tokenizer_choice=source.tokenizer, text_field=source.text_name,
                              label_field=source.label_name, long_samples=source.long_sample_rule)


def corpus_to_train(corpus: Any, spec: WorkloadSpec, seed: int, token_budget: int | None, workload: Any):
    """The samples to train on (the synthetic corpus without ``--data``), checked against the token budget."""
    from gaplan.data import SyntheticCorpus, TextCorpus

    if corpus is None and model_source_kind(spec.model) != "function":
        corpus = SyntheticCorpus(workload.seq_len, workload.num_labels or 4, seed=seed,
                                 target_len=workload.info.get("target_len"))
    # The longest sample the steps can hold: the data's (read already), else a full-length synthetic one.
    longest = max(map(len, (s.ids for s in corpus.samples))) if isinstance(corpus, TextCorpus) else workload.seq_len
    if token_budget and longest and token_budget < longest:
        raise GaplanError(f"--token-budget {token_budget} is below the longest sample ({longest} tokens): "
                          "it would not fit in any micro-batch")
    return corpus
