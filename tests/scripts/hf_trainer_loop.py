"""The Hugging Face Trainer on a small GPT-2, as a user runs it, for ``probe_trainer`` and for a fresh-process check.

``python hf_trainer_loop.py MICRO_BATCH LIMIT [lora]`` trains two optimizer steps of two micro-batches under
``gaplan.cpu_budget(LIMIT)`` (taken after the imports, before the model is built) and exits 0, or 3 when it runs
out of memory. ``lora``: the model wrapped by peft (LoRA r=8 on the attention), the base frozen.
"""

import sys
import tempfile

# isort: off
import gaplan  # first: MKL's pooled workspace off before torch loads, as in the probe's trials
import peft  # imported with the rest, before the budget: library code is not training memory
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

# isort: on

SEQ_LEN = 128


def model(lora=False):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=SEQ_LEN, use_cache=False)
    built = GPT2LMHeadModel(config)
    if lora:
        built = peft.get_peft_model(built, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"],
                                                           fan_in_fan_out=True, task_type="CAUSAL_LM"))
    return built


def dataset(count=64):
    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(count):
        length = SEQ_LEN if index % 2 else SEQ_LEN // 2  # the probe samples the longest ones
        ids = torch.randint(0, 8192, (length,), generator=generator)
        samples.append({"input_ids": ids, "labels": ids.clone()})
    return samples


def collate(samples):
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full((len(samples), longest), -100, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        labels[row, : len(sample["labels"])] = sample["labels"]
    return {"input_ids": ids, "labels": labels, "attention_mask": (labels != -100).long()}


def args(output_dir, micro_batch=1):
    return TrainingArguments(output_dir=output_dir, use_cpu=True, per_device_train_batch_size=micro_batch,
                             gradient_accumulation_steps=2, max_steps=2, learning_rate=1e-4, report_to=[],
                             save_strategy="no", disable_tqdm=True, remove_unused_columns=False,
                             dataloader_pin_memory=False, logging_strategy="no")


def main(micro_batch, limit, lora):
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = args(output_dir, micro_batch)
        full = [s for s in dataset() if len(s["input_ids"]) == SEQ_LEN]  # the full-length ones: the worst case
        data = [full[i % len(full)] for i in range(4 * micro_batch)]  # every micro-batch full: 2 steps of 2
        gaplan.cpu_budget(limit)  # after the imports, before the model: as a probe trial takes it
        trainer = Trainer(model=model(lora), args=training_args, train_dataset=data, data_collator=collate)
        try:
            trainer.train()
        except RuntimeError as exc:
            if "can't allocate memory" not in str(exc):
                raise
            sys.exit(3)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3:] == ["lora"])
