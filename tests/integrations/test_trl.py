"""GaplanSFTTrainer: TRL's SFTTrainer (its own tokenizing and collator) trains gaplan's plan at B* itself, uneven
too, with the loss of one large batch."""

from __future__ import annotations

import pytest
import torch

from gaplan.plan.split import make_plan
from gaplan.workload.loss import summed_token_loss
from tests.model_folders import make_tokenizer
from tests.scripts.trainer_steps import record_micro_batch_sizes, worst_update_difference

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


def _model(tokenizer):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=64,
                                     use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     pad_token_id=tokenizer.pad_token_id)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.slow
def test_gaplan_sft_trainer_trains_an_uneven_plan_with_one_large_batchs_sgd_update(tmp_path):
    """Texts of 1 to 5 phrases (TRL pads each micro-batch): the plan 4,4,3 of 11 (B* 4, no divisor traded) trains one
    SGD step equal to the 11 as one batch of TRL's own collation, to 1e-5. SFTConfig's bf16 default (autocast, on the
    CPU too) is turned off: under it no two losses agree to 1e-5."""
    from gaplan.integrations.transformers import GaplanSFTTrainer

    assert issubclass(GaplanSFTTrainer, trl.SFTTrainer) and GaplanSFTTrainer.__name__ == "GaplanSFTTrainer"
    tokenizer = make_tokenizer(str(tmp_path / "tokenizer"))
    texts = datasets.Dataset.from_list([{"text": " ".join(["lorem ipsum dolor sit amet"] * (1 + (i * 7) % 5))}
                                        for i in range(11)])
    plan = make_plan(11, 4)
    assert plan.micro_batch_sizes == (4, 4, 3)
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_length=64,
                         disable_tqdm=True, max_steps=1, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
                         max_grad_norm=0.0, weight_decay=0.0, save_strategy="no", logging_strategy="no", seed=7,
                         dataloader_pin_memory=False, bf16=False)
    model = _model(tokenizer)
    start = {name: param.detach().clone() for name, param in model.named_parameters()}
    trainer = GaplanSFTTrainer(model=model, args=args, train_dataset=texts, processing_class=tokenizer, plan=plan,
                               noise_scale=False)
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 3)
    sizes = record_micro_batch_sizes(trainer)
    trainer.train()
    assert sorted(sizes) == [3, 4, 4]

    reference = _model(tokenizer)
    whole = trainer.data_collator([trainer.train_dataset[i] for i in range(11)])
    assert len(set((whole["labels"][:, 1:] != -100).sum(1).tolist())) > 2  # padded: the samples' targets differ
    logits = reference(input_ids=whole["input_ids"], attention_mask=whole["attention_mask"]).logits
    (summed_token_loss(logits, whole, "causal-lm") / (whole["labels"][:, 1:] != -100).sum()).backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    expected = {name: param.detach() for name, param in reference.named_parameters()}
    worst = worst_update_difference(trainer.model, expected, start)
    assert worst < 1e-5, worst
