"""TRL's SFTTrainer at B* itself: the Trainer mode probes ``SFTTrainer.train()`` (its tokenizing, collator and step)
under a CPU budget, and ``GaplanSFTTrainer(plan=...)`` trains gaplan's plan (uneven too) with the token-exact loss.

    python examples/trl_sft.py                       # GPT-2 2 x 64, vocab 300, max length 128, 256 MiB, E 40
    python examples/trl_sft.py --budget 512MiB --effective-batch 64

The stock SFTTrainer feeds equal micro-batches, so it would run a divisor of the effective batch under B*; the
plan's own sizes come from ``gaplan.PlanBatchSampler``. Prints numbers; asserts nothing (tests/test_examples.py
checks them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--effective-batch", type=int, default=40)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    import datasets
    import transformers
    import trl

    from gaplan.integrations.trainer_probe import probe_trainer
    from gaplan.integrations.transformers import GaplanSFTTrainer

    sys.path.insert(0, REPO_ROOT)
    from tests.model_folders import make_tokenizer  # a small byte-level BPE trained offline (no download)

    work = tempfile.mkdtemp(prefix="gaplan-trl-")
    tokenizer = make_tokenizer(os.path.join(work, "tokenizer"))
    phrases = ["the cat sat on the mat", "a dog ran in the park", "lorem ipsum dolor sit amet"]
    texts = datasets.Dataset.from_list([{"text": " ".join([phrases[i % 3]] * (1 + (i * 7) % 9))}
                                        for i in range(args.effective_batch * args.steps)])

    def model_init():
        import torch

        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=len(tokenizer), n_positions=128,
                                         use_cache=False, pad_token_id=tokenizer.pad_token_id,
                                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        return transformers.GPT2LMHeadModel(config)

    # bf16=False: SFTConfig turns bf16 on by default (autocast, on the CPU too); fp32 keeps the example's numbers exact.
    config = trl.SFTConfig(output_dir=os.path.join(work, "out"), use_cpu=True, report_to=[], max_length=128,
                           disable_tqdm=True, dataloader_pin_memory=False, bf16=False, max_steps=args.steps,
                           learning_rate=1e-3, logging_steps=1, save_strategy="no", seed=0)
    found = probe_trainer(model_init, config, texts, effective_batch=args.effective_batch,
                          trainer_class=trl.SFTTrainer, memory_limit=args.budget, processing_class=tokenizer)
    print(f"B* = {found.max_micro_batch} in {len(found.trials)} trials of SFTTrainer.train(); "
          f"plan: {found.plan.describe()}")
    trainer = GaplanSFTTrainer(model=model_init(), args=config, train_dataset=texts, processing_class=tokenizer,
                               plan=found.plan)
    sizes = []  # each micro-batch as the collator builds it, for the lines below
    collate = trainer.data_collator
    trainer.data_collator = lambda rows: sizes.append(len(rows)) or collate(rows)
    trainer.train()
    steps = found.plan.grad_accum_steps
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    for step, loss in enumerate(losses, 1):
        print(f"step {step}: micro-batches {sizes[(step - 1) * steps:step * steps]}, loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
