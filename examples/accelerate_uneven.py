"""An accelerate loop at B* itself: ``plan_accelerator`` probes the loop's own step under a CPU budget, and
``gaplan.PlanBatchSampler`` feeds its plan (uneven too) through ``accelerator.prepare`` with the token-exact loss.

    python examples/accelerate_uneven.py                      # GPT-2 2 x 64, vocab 8192, seq 128, 256 MiB, E 40 (~1 min)
    python examples/accelerate_uneven.py --budget 512MiB --effective-batch 64

The data are padded samples of different lengths, so a per-micro-batch mean would weight them wrongly. The first
optimizer step's update is compared with one batch of the same samples; then a few steps train. Prints numbers;
asserts nothing (tests/test_examples.py checks them).
"""

from __future__ import annotations  # noqa: I001 - gaplan first, before torch (docs/your-loop.md)

import argparse

import gaplan  # first: the budget's allocator settings before torch loads

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import GradientAccumulationPlugin  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from gaplan.integrations.accelerate import count_step_items, plan_accelerator, step_loss  # noqa: E402
from gaplan.workload.loss import summed_token_loss  # noqa: E402

VOCAB, SEQ = 8192, 128


def build_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                      eos_token_id=0))


def setup():
    model = build_model()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def make_batch(size: int) -> dict:
    """The probe's micro-batch: ``size`` samples at the longest length."""
    ids = torch.randint(1, VOCAB, (size, SEQ))
    return {"input_ids": ids, "labels": ids}


def micro_step(model, batch) -> None:
    summed_token_loss(model(input_ids=batch["input_ids"]).logits, batch, "causal-lm").backward()


def samples(count: int) -> list[dict]:
    """Padded samples of 8 to 128 tokens (labels -100 past each one's end)."""
    generator = torch.Generator().manual_seed(1)
    rows = []
    for index in range(count):
        length = 8 + (index * 13) % (SEQ - 7)
        ids = torch.zeros(SEQ, dtype=torch.long)
        ids[:length] = torch.randint(1, VOCAB, (length,), generator=generator)
        labels = torch.full((SEQ,), -100)
        labels[:length] = ids[:length]
        mask = (torch.arange(SEQ) < length).long()
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


def collate(rows: list[dict]) -> dict:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--effective-batch", type=int, default=40)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    # The recipe takes each step's micro-batches before their backward (to count the step's targets): the
    # Accelerator must not also sync at the end of its dataloader, or the epoch's last step would sync on each.
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
        num_steps=1, sync_with_dataloader=False))
    result = plan_accelerator(accelerator, setup, make_batch, micro_step, effective_batch=args.effective_batch,
                              memory_limit=args.budget, threads=1)
    plan = result.plan
    print(f"B* = {result.max_micro_batch} in {len(result.trials)} trials; plan: {plan.describe()}")
    accelerator.gradient_accumulation_steps = plan.grad_accum_steps  # the accumulate form: backward divides by it

    data = samples(plan.effective_batch * args.steps)
    sampler = gaplan.PlanBatchSampler(plan, len(data), seed=0)
    first_step = [index for _, micro in zip(range(plan.grad_accum_steps), iter(sampler), strict=False) for index in micro]
    model, optimizer = setup()
    before = [param.detach().clone() for param in model.parameters()]
    model, optimizer, loader = accelerator.prepare(model, optimizer,
                                                   DataLoader(data, batch_sampler=sampler, collate_fn=collate))
    batches = iter(loader)
    for step in range(sampler.steps):
        micro_batches = [next(batches) for _ in range(plan.grad_accum_steps)]
        items = count_step_items(accelerator, micro_batches, "causal-lm")
        total, syncs = 0.0, []
        for batch in micro_batches:
            with accelerator.accumulate(model):
                syncs.append(accelerator.sync_gradients)
                summed = summed_token_loss(model(input_ids=batch["input_ids"],
                                                 attention_mask=batch["attention_mask"]).logits, batch, "causal-lm")
                accelerator.backward(step_loss(accelerator, summed, items))
                total += float(summed.detach())
                optimizer.step()
                optimizer.zero_grad()
        print(f"step {step + 1}: micro-batches {[len(b['input_ids']) for b in micro_batches]}, "
              f"optimizer stepped after micro-batch {[i + 1 for i, sync in enumerate(syncs) if sync]}, "
              f"loss {total / items:.4f} over {items} targets")
        if step == 0:
            update = [param.detach() - start for param, start in zip(model.parameters(), before, strict=True)]

    # The first step as one batch of the same samples: the update SGD makes from sum / targets of the whole step.
    reference, reference_optimizer = setup()
    whole = collate([data[index] for index in first_step])
    logits = reference(input_ids=whole["input_ids"], attention_mask=whole["attention_mask"]).logits
    (summed_token_loss(logits, whole, "causal-lm") / int((whole["labels"][:, 1:] != -100).sum())).backward()
    reference_optimizer.step()
    wanted = [param.detach() - start for param, start in zip(reference.parameters(), before, strict=True)]
    difference = sum(float((mine - want).square().sum()) for mine, want in zip(update, wanted, strict=True)) ** 0.5
    relative = difference / sum(float(want.square().sum()) for want in wanted) ** 0.5
    print(f"first step's update vs one batch of its {len(first_step)} samples: relative difference {relative:.1e} "
          "(the norm of the difference over the norm of the update)")


if __name__ == "__main__":
    main()
