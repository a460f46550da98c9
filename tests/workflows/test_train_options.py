"""gaplan train's options as one tree: checked once in field names, saved flat, and older run folders resume."""

import dataclasses
import json

import pytest

from gaplan.core.options import OptionError, from_saved, to_saved
from gaplan.data.source import READ_DEFAULTS, DataSource
from gaplan.runs.folder import CHECKPOINT, TRAIN_JSON
from gaplan.training.config import LoopOptions, TrainConfig
from gaplan.workflows.train_options import TrainOptions, resume_marks
from gaplan.workflows.train_resume import resume_settings

# train.json's options as gaplan wrote them before the options were nested (one flat dict of every field).
OLD_FLAT_OPTIONS = {
    "effective_batch": 16, "effective_tokens": None, "micro_batch": 4, "batch_by": "samples", "token_budget": None,
    "granule": 64, "plan_file": None, "grad_checkpointing": None, "data": None, "text_field": "text",
    "label_field": "label", "long_samples": "split", "tokenizer": None, "steps": 3, "seed": 7, "max_grad_norm": None,
    "warmup_steps": 0, "checkpoint_every": 1, "resume": False, "save_weights": None, "save_model": None,
    "enforce_memory_limit": False, "compare": False, "threads": None, "command": "gaplan train --steps 3",
}


def test_the_flat_options_fill_the_nested_data_source_and_loop():
    options = from_saved(TrainOptions, {"data": "corpus.txt", "tokenizer": "bytes", "steps": 5, "seed": 3,
                                      "micro_batch": 2})
    assert options.source == DataSource(path="corpus.txt", tokenizer="bytes")
    assert options.loop == LoopOptions(steps=5, seed=3)
    assert options.micro_batch == 2 and options.data == "corpus.txt" and options.steps == 5


# Options added since, each with the default an older folder's run had (their behaviour before the option existed).
ADDED_SINCE = {"merge": False, "noise_scale": True, "lr_scaling": "none", "target_field": None,
               "batch_schedule": "fixed", "effective_batch_min": None}
# The data fields an older folder holds at their defaults read back as not given (the default's own name is no choice).
NOT_GIVEN = {"text_field": None, "label_field": None, "long_samples": None, "granule": None}


def test_saved_flat_is_the_shape_older_run_folders_have():
    assert set(to_saved(TrainOptions())) == set(OLD_FLAT_OPTIONS) | set(ADDED_SINCE)
    old = from_saved(TrainOptions, OLD_FLAT_OPTIONS)
    old = dataclasses.replace(old, source=old.source.without_defaults())  # as resume reads an older run's train.json
    assert to_saved(old) == {**OLD_FLAT_OPTIONS, **ADDED_SINCE, **NOT_GIVEN}


@pytest.mark.parametrize("field, task", [("target_field", "causal-lm"), ("label_field", "causal-lm"),
                                         ("target_field", "classification"), ("label_field", "seq2seq-lm")])
def test_a_data_field_given_at_its_defaults_value_is_still_given(field, task):
    """Issue 46's own example: --target-field target on a causal LM is refused, not read as "not given"."""
    source = DataSource(path="pairs.jsonl", **{field: READ_DEFAULTS[field]})
    with pytest.raises(OptionError, match=f"^{field} applies to task"):
        source.check_applies(task)
    assert source.without_defaults() == DataSource(path="pairs.jsonl")  # an older run's record: not given
    source.without_defaults().check_applies(task)


def test_resume_marks_are_the_fields_metadata():
    marks = resume_marks()
    assert {name for name, mark in marks.items() if mark == "free"} == {
        "steps", "checkpoint_every", "save_weights", "save_model", "compare", "threads", "command",
        "enforce_memory_limit", "merge", "noise_scale", "micro_batch"}
    assert marks["seed"] == marks["data"] == marks["effective_batch"] == "fixed"
    assert "grad_checkpointing" not in marks and "resume" not in marks  # the spec holds one; the run sets the other


@pytest.mark.parametrize("fields, message", [
    (dict(micro_batch=0), "micro_batch must be a positive integer (got 0)"),
    (dict(effective_tokens=100), "effective_tokens needs batch_by tokens"),
    (dict(batch_by="tokens", effective_tokens=100, effective_batch=8), "effective_tokens and effective_batch both"),
    (dict(token_budget=64), "token_budget needs batch_by tokens"),
    (dict(batch_by="tokens", token_budget=1), "token_budget must be at least 2 tokens (got 1)"),
    (dict(batch_by="tokens", micro_batch=4), "leave out micro_batch and plan_file"),
    (dict(granule=0), "granule must be a positive number of tokens (got 0)"),
    (dict(steps=0), "steps must be a positive integer (got 0)"),
    (dict(warmup_steps=-1), "warmup_steps must be 0 or more (got -1)"),
    (dict(steps=5, warmup_steps=6), "warmup_steps (6) is above steps (5): the learning rate would never reach"),
    # known before any probe (it was refused after one): an effective batch of 1 measures no noise scale
    (dict(batch_schedule="adaptive", effective_batch=1), "an effective batch of 1 on one process is one"),
    (dict(max_grad_norm=-1.0), "max_grad_norm must be a positive number (got -1.0)"),
    (dict(max_grad_norm=float("inf")), "max_grad_norm must be a positive number (got inf)"),
])
def test_each_check_is_made_once_in_the_options_and_says_field_names(fields, message):
    with pytest.raises(OptionError) as caught:
        from_saved(TrainOptions, fields)
    assert message in str(caught.value)
    assert "--" not in str(caught.value)


def test_the_loop_config_is_the_loop_options_plus_what_the_run_decides():
    config = TrainConfig(steps=4, seed=1, run_dir="run")
    assert isinstance(config, LoopOptions) and config.steps == 4 and config.run_dir == "run"
    with pytest.raises(OptionError, match="checkpoint_every must be 0 or more"):
        TrainConfig(checkpoint_every=-1)


def _old_run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / CHECKPOINT).write_bytes(b"")  # resume_settings only needs it to exist; the loop reads it
    (run / TRAIN_JSON).write_text(json.dumps({"workload": {"model": "tiny-gpt2", "seq_len": 16},
                                              "options": OLD_FLAT_OPTIONS,
                                              "environment": {"device": "cpu", "memory_limit": None}}))
    return str(run)


def test_an_older_run_folder_resumes_with_its_options_and_takes_the_free_ones_given(tmp_path):
    spec, options, environment = resume_settings(_old_run_folder(tmp_path), {}, {"steps": 6, "checkpoint_every": 2})
    assert spec.seq_len == 16 and environment["device"] == "cpu"
    assert options.resume and options.micro_batch == 4 and options.seed == 7 and options.effective_batch == 16
    assert options.loop == LoopOptions(steps=6, seed=7, checkpoint_every=2)


def test_a_fixed_option_given_again_must_agree(tmp_path):
    folder = _old_run_folder(tmp_path)
    with pytest.raises(Exception, match="--seed 8 contradicts the run's 7"):
        resume_settings(folder, {}, {"seed": 8})
    with pytest.raises(Exception, match="--data other.txt contradicts"):
        resume_settings(folder, {}, {"data": "other.txt"})
    assert resume_settings(folder, {}, {"seed": 7})[1].seed == 7
    with pytest.raises(Exception, match=r"--lr 0.5 contradicts the run's default \(it was started without one\)"):
        resume_settings(folder, {"lr": 0.5}, {})  # the run's None is its optimizer's default, said so


def test_a_folder_without_a_checkpoint_or_a_run_record_has_nothing_to_resume(tmp_path):
    """With train.json and no checkpoint, a run that stopped before its first one: it is read, to be trained again
    from the start (tests/cli/test_resume_anywhere.py); with neither, nothing is there."""
    with pytest.raises(Exception, match=f"no {CHECKPOINT} in it"):
        resume_settings(str(tmp_path), {}, {})
    (tmp_path / TRAIN_JSON).write_text("{}")
    with pytest.raises(Exception, match=f"{TRAIN_JSON} is not a gaplan train record"):
        resume_settings(str(tmp_path), {}, {})
