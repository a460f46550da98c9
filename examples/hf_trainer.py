"""gaplan with the Hugging Face Trainer: plan the batch arguments, then train with the token-exact loss.

    python examples/hf_trainer.py                                  # with a given B* (seconds)
    python examples/hf_trainer.py --max-micro-batch 5              # an uneven plan: warns, splits evenly
    python examples/hf_trainer.py --probe --memory-limit 256MiB    # probe B* first (a minute or two on a small CPU;
                                                                   # this small model fits the whole batch of 24)

A small GPT-2 is built from a config (no download) and trained for a few steps on
gaplan's synthetic corpus of padded, variable-length sequences.
``plan_training_arguments`` turns the plan into ``per_device_train_batch_size`` and
``gradient_accumulation_steps``; ``GaplanTrainer`` divides the summed token loss by
the targets of the whole optimizer step, so the accumulated gradient is the
large-batch gradient however the batches are padded.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

from transformers import AutoModelForCausalLM, GPT2Config, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

import gaplan
from gaplan.data import SyntheticCorpus, collate
from gaplan.integrations.transformers import (
    GaplanTrainer,
    UnevenPlanWarning,
    hf_snippet,
    plan_training_arguments,
    resolve_plan,
)

SEQ_LEN = 16


class PrintLoss(TrainerCallback):
    """One line per optimizer step (the Trainer logs the step's loss with ``logging_steps=1``)."""

    def __init__(self) -> None:
        self.last: float | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.last = logs["loss"]
            print(f"step {state.global_step}: loss {self.last:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effective-batch", type=int, default=24)
    parser.add_argument("--max-micro-batch", type=int, default=8, help="B*, when not probing")
    parser.add_argument("--probe", action="store_true", help="find B* with gaplan.probe instead")
    parser.add_argument("--memory-limit", default="256MiB", help="the probe's budget")
    parser.add_argument("--steps", type=int, default=5)
    options = parser.parse_args()

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = AutoModelForCausalLM.from_config(config)
    corpus = SyntheticCorpus(SEQ_LEN, seed=0)
    train_dataset = [corpus[i] for i in range(options.effective_batch * options.steps)]

    with tempfile.TemporaryDirectory() as output_dir:
        base = TrainingArguments(
            output_dir=output_dir, max_steps=options.steps, learning_rate=1e-2, lr_scheduler_type="constant",
            logging_steps=1, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
            remove_unused_columns=False, dataloader_pin_memory=False, seed=0)
        if options.probe:  # builds the model from its config in a worker process, at this sequence length
            plan = resolve_plan(model, base, options.effective_batch, memory_limit=options.memory_limit, seq_len=SEQ_LEN)
        else:
            plan = gaplan.make_plan(options.effective_batch, options.max_micro_batch)
        print(f"gaplan plan: effective batch {plan.effective_batch} as micro-batches "
              f"{','.join(map(str, plan.micro_batch_sizes))} (largest that fits: {plan.micro_batch_cap})")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UnevenPlanWarning)
            args = plan_training_arguments(model, base, options.effective_batch, plan=plan)
        for warning in caught:
            print(f"note: {warning.message}")
        print(f"Trainer: {args.per_device_train_batch_size} per device x {args.gradient_accumulation_steps} "
              f"accumulation steps x {args.world_size} device(s); to paste into a script:")
        print(hf_snippet(plan))
        printer = PrintLoss()
        trainer = GaplanTrainer(model=model, args=args, train_dataset=train_dataset,
                                data_collator=lambda samples: collate(samples, "causal-lm"), callbacks=[printer])
        trainer.remove_callback(PrinterCallback)  # the Trainer's own printing of each log dict
        trainer.train()
    print(f"final loss: {printer.last:.4f}")


if __name__ == "__main__":
    main()
