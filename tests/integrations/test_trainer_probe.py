"""Probing trainer.train() itself (the Trainer mode of plan_training_arguments): B* is the edge of the user's Trainer.

As for gaplan.probe_loop, the acceptance runs in fresh processes: the probe (through ``model_init``, so its
trials are as cold as a new process), then ``trainer.train()`` at B* and B*+1 under ``gaplan.cpu_budget``.
"""

from __future__ import annotations

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.integrations.trainer_probe import longest_samples

from ..probing.test_loop import edge_holds_in_fresh_processes, probed_edge

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

@pytest.mark.heavy
@pytest.mark.slow
def test_the_edge_of_trainer_train_holds_in_fresh_processes_and_lora_fits_more():
    edge = edge_holds_in_fresh_processes("trainer", "hf_trainer_loop.py")["max_micro_batch"]
    pytest.importorskip("peft")
    lora = probed_edge("trainer-lora")
    # The frozen base has no gradients and no AdamW states: more room for activations.
    assert lora["max_micro_batch"] > edge, (lora["max_micro_batch"], edge)


def test_the_sample_is_the_longest_rows_cycled():
    rows = [{"input_ids": list(range(n))} for n in (3, 9, 5)]
    assert [len(r["input_ids"]) for r in longest_samples(rows, 5)] == [9, 5, 3, 9, 5]
    assert [len(r["text"]) for r in longest_samples([{"text": "ab"}, {"text": "abcd"}], 1)] == [4]
    with pytest.raises(GaplanError, match="cannot tell a sample's length"):
        longest_samples([{"x": 1}], 1)
    with pytest.raises(GaplanError, match="empty"):
        longest_samples([], 1)


def _tiny():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=300, n_positions=32, use_cache=False)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.slow
@pytest.mark.parametrize("given", [pytest.param("arguments", marks=pytest.mark.heavy), "a function that builds them"])
def test_plan_training_arguments_in_trainer_mode_plans_from_the_trainers_own_edge(tmp_path, given, capsys):
    """The arguments as built, or (as on a CUDA machine, where building them sets the device) the function that
    builds them, called in the trials and at the end only."""
    rows = [{"input_ids": torch.randint(0, 300, (32,)), "labels": torch.randint(0, 300, (32,))} for _ in range(8)]

    def build():
        return transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                              save_strategy="no", disable_tqdm=True, remove_unused_columns=False,
                                              dataloader_pin_memory=False)

    import warnings

    from gaplan.integrations.transformers import plan_trainer

    args = build() if given == "arguments" else build
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an uneven plan's warning: what it says is tested in test_transformers.py
        found = plan_trainer(_tiny, args, 64, probe="trainer", train_dataset=rows, memory_limit="256MiB",
                             data_collator=lambda batch: {k: torch.stack([r[k] for r in batch])
                                                          for k in ("input_ids", "labels")})
    # What the route found, typed: B*, its trials, gaplan's plan at B*, the split the arguments run
    assert found.max_micro_batch == found.probe.max_micro_batch == found.plan.micro_batch_cap
    assert found.trials and max(t.micro_batch for t in found.trials if t.fits) == found.max_micro_batch
    assert found.plan.micro_batch == min(found.max_micro_batch, 64) and found.split.micro_batch <= found.plan.micro_batch
    assert f"B* = {found.max_micro_batch}" in found.describe()
    planned = found.args
    assert (planned.per_device_train_batch_size, planned.gradient_accumulation_steps) == \
        (found.split.micro_batch, found.split.grad_accum_steps)
    assert planned.per_device_train_batch_size * planned.gradient_accumulation_steps == 64
    assert planned.per_device_train_batch_size >= 1 and not planned.auto_find_batch_size
    assert isinstance(planned, transformers.TrainingArguments) and planned.use_cpu
    # Progress as the Trainer's own: a bar on stderr unless disable_tqdm (arguments given as a function: not read).
    bar = capsys.readouterr().err
    assert ("gaplan: probing the Trainer" in bar) == (given != "arguments"), bar[-500:]
    assert given == "arguments" or f"{len(found.trials)}trial" in bar.replace(" ", ""), bar[-500:]


def test_trainer_mode_needs_the_model_and_the_data(tmp_path):
    from gaplan.integrations.transformers import plan_training_arguments

    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(GaplanError, match="pass train_dataset="):
        plan_training_arguments(_tiny(), args, 8, probe="trainer")
    with pytest.raises(GaplanError, match="pass the model, or a function that builds it"):
        plan_training_arguments("tiny-gpt2", args, 8, probe="trainer", train_dataset=[{"input_ids": [1]}])
    with pytest.raises(GaplanError, match="probe must be 'workload' or 'trainer'"):
        plan_training_arguments(_tiny(), args, 8, probe="guess")


@pytest.mark.slow
@pytest.mark.heavy
def test_trl_sft_trainer_is_probed_the_same_way(tmp_path):
    """TRL's SFTTrainer (an optional extra): its own tokenizing, collator and loss run in each trial."""
    trl = pytest.importorskip("trl")
    from gaplan.integrations.trainer_probe import probe_trainer
    from tests.model_folders import make_tokenizer

    tokenizer = make_tokenizer(str(tmp_path / "tokenizer"))
    texts = [{"text": " ".join(["lorem ipsum dolor sit amet"] * (1 + i % 4))} for i in range(16)]
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_length=32,
                         disable_tqdm=True, dataloader_pin_memory=False)

    def model_init():
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=len(tokenizer), n_positions=32,
                                         use_cache=False, pad_token_id=tokenizer.pad_token_id)
        return transformers.GPT2LMHeadModel(config)

    import datasets

    result = probe_trainer(model_init, args, datasets.Dataset.from_list(texts), effective_batch=32,
                           trainer_class=trl.SFTTrainer, memory_limit="256MiB", processing_class=tokenizer)
    assert result.max_micro_batch >= 1 and result.plan.effective_batch == 32
    assert all(t.completed_steps == 2 for t in result.trials if t.fits)


@pytest.mark.heavy
@pytest.mark.slow
def test_a_users_qlora_model_is_probed_through_its_trainer_with_its_4_bit_base(tmp_path):
    """QLoRA as transformers and peft build it (from_pretrained with a BitsAndBytesConfig, nf4 on the CPU), probed
    in the Trainer's own steps, each probe in a fresh process (tests/scripts/qlora_trainer_probe.py): each trial
    holds the 4-bit base, so at every micro-batch both probes measured the QLoRA trial is lower than the LoRA one on
    the same model in full precision, by what 4 bits save."""
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    import json

    from gaplan.estimate.quantized import BYTES_PER_WEIGHT

    from ..probing.test_loop import run_script

    folder = str(tmp_path / "llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                      num_attention_heads=4, vocab_size=300, max_position_embeddings=64, use_cache=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    linear_bytes = 4 * (4 * 256 * 256 + 3 * 256 * 1024) * 4  # the projections in fp32: 16 MiB
    peaks = {}
    for what in ("lora", "qlora"):
        done = run_script("qlora_trainer_probe.py", what, folder)
        assert done.returncode == 0, done.stderr[-3000:]
        peaks[what] = {int(size): peak for size, peak in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    common = sorted(set(peaks["lora"]) & set(peaks["qlora"]))
    assert common, peaks
    # What gaplan's estimate says 4 bits save: the projections' fp32 bytes less their nf4 bytes (13.9 MiB), less one
    # layer's dequantized copy (1 MiB) if the peak is inside its product. Measured: 13.2, 13.7 and 14.0 MiB at
    # micro-batch 1, 2 and 4. Probed from the test's own process instead, the trials reused its freed heap and
    # both read lower, the difference ~0.
    most = linear_bytes - linear_bytes // 4 * BYTES_PER_WEIGHT
    least = most - 256 * 1024 * 4
    for size in common:
        saved = peaks["lora"][size] - peaks["qlora"][size]
        assert 0.95 * least <= saved <= 1.05 * most, (size, saved / 2**20, least / 2**20)


def test_a_process_whose_cuda_bitsandbytes_initialized_is_told_to_import_it_in_model_init(tmp_path, monkeypatch):
    """A stand-in for an initialized CUDA (``cuda_initialized``, no GPU here): the message is under test."""
    pytest.importorskip("bitsandbytes")
    import gaplan.integrations.trainer_probe as trainer_probe

    monkeypatch.setattr(trainer_probe, "cuda_initialized", lambda: True)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[])
    with pytest.raises(GaplanError, match="bitsandbytes, imported here, did: import peft and bitsandbytes inside a "
                                          "model_init function"):
        trainer_probe.probe_trainer(_tiny, args, [{"input_ids": [1]}], effective_batch=8)
