"""Two ranks of accelerate (torchrun, gloo on CPU) training one step with gaplan's recipe; rank 0 prints the largest
relative difference of the synced gradient from one full batch of all ranks' samples, and the plan's steps.

    torchrun --nproc-per-node 2 tests/scripts/accelerate_ddp.py
"""

import json

import torch

from gaplan.data import SyntheticCorpus, collate
from gaplan.integrations.accelerate import count_step_items, step_loss
from gaplan.workload.loss import summed_token_loss

TASK = "causal-lm"


def tiny_model():
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return AutoModelForCausalLM.from_config(config)


def train_one_step(accelerator, samples, splits):
    """One optimizer step of gaplan's recipe on this rank's ``samples`` cut in ``splits``; the synced gradient."""
    micro_batches = [collate(samples[s:s + n], TASK) for s, n in zip([sum(splits[:i]) for i in range(len(splits))],
                                                                        splits, strict=True)]
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accumulated_step(accelerator, model, optimizer, micro_batches)


def accumulated_step(accelerator, model, optimizer, micro_batches):
    """The recipe's optimizer step over ``micro_batches`` (prepared model and optimizer): the synced gradient and the
    step's targets over all ranks."""
    items = count_step_items(accelerator, micro_batches, TASK)
    accelerator.step = 0  # accelerate counts micro-steps over the Accelerator's life: this is a new first step
    got = None
    for batch in micro_batches:
        with accelerator.accumulate(model):
            accelerator.backward(step_loss(accelerator, summed_token_loss(model(**batch).logits, batch, TASK), items))
            if accelerator.sync_gradients:
                got = {n: p.grad.detach().clone() for n, p in accelerator.unwrap_model(model).named_parameters()}
            optimizer.step()
            optimizer.zero_grad()
    # The model's reducer holds the gloo group in reference cycles: freed now, while the interpreter is whole, not at
    # its teardown, where freeing a gloo group can abort a rank that has finished.
    del model, optimizer
    import gc

    gc.collect()
    return got, items


def train_sampled_step(accelerator, samples, plan):
    """One optimizer step of the recipe with the plan's micro-batches fed by ``PlanBatchSampler`` through
    ``prepare``: this rank's micro-batch sizes, the synced gradient, and the indices of the step on all ranks."""
    from torch.utils.data import DataLoader

    from gaplan import PlanBatchSampler

    sampler = PlanBatchSampler(plan, len(samples), seed=3)
    loader = DataLoader(samples, batch_sampler=sampler, collate_fn=lambda rows: collate(rows, TASK))
    step_indices = [i for micro in list(sampler)[:plan.grad_accum_steps * plan.world_size] for i in micro]
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = iter(loader)
    micro_batches = [next(batches) for _ in range(plan.grad_accum_steps)]
    del loader, batches
    got, _ = accumulated_step(accelerator, model, optimizer, micro_batches)
    del model, optimizer  # this frame's references too, before the interpreter's teardown (see accumulated_step)
    import gc

    gc.collect()
    return [len(batch["input_ids"]) for batch in micro_batches], got, step_indices


def worst_difference(got, samples):
    """The largest relative difference of ``got`` from the gradient of ``samples`` as one batch."""
    reference = tiny_model()
    whole = collate(samples, TASK)
    targets = (whole["labels"][:, 1:] != -100).sum()
    (summed_token_loss(reference(**whole).logits, whole, TASK) / targets).backward()
    worst = max(((got[n] - p.grad).abs().max() / p.grad.abs().max()).item() for n, p in reference.named_parameters())
    return worst, int(targets)


def main():
    import accelerate

    from gaplan.integrations.accelerate import plan_accelerator

    corpus = SyntheticCorpus(32, seed=0)
    samples = [corpus[i] for i in range(14)]  # 7 a rank, split 3 + 2 + 2: uneven, and padded differently
    from accelerate.utils import GradientAccumulationPlugin

    # The recipe takes a step's micro-batches before their backward: no sync at the end of the dataloader.
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
        num_steps=3, sync_with_dataloader=False))
    rank, world = accelerator.process_index, accelerator.num_processes
    got, items = train_one_step(accelerator, samples[rank * 7:(rank + 1) * 7], (3, 2, 2))

    # Planned from inside the launch: the main process probes, every rank takes its plan; then one step at it.
    def setup():
        model = tiny_model()
        return model, torch.optim.AdamW(model.parameters())

    def micro_step(model, ids):
        model(input_ids=ids, labels=ids).loss.backward()

    effective = 64  # a rank's share, 32, is above what the budget holds: the plan accumulates
    accelerator.gradient_accumulation_steps = 1  # plan_accelerator leaves it as it is; the plan's is set below
    result = plan_accelerator(accelerator, setup, lambda size: torch.randint(1, 256, (size, 32)), micro_step,
                              effective_batch=effective, memory_limit=12 << 20, threads=1)
    plan = result.plan
    untouched = accelerator.gradient_accumulation_steps
    accelerator.gradient_accumulation_steps = plan.grad_accum_steps  # the accumulate form: set by the loop
    share = effective // world
    planned = [corpus[i] for i in range(100, 100 + effective)]
    planned_got, _ = train_one_step(accelerator, planned[rank * share:(rank + 1) * share],
                                    plan.rank_micro_batch_sizes[rank])
    # An uneven plan (22 over 2 ranks at B* 4: each rank 4,4,3) fed by PlanBatchSampler through prepare.
    from gaplan.plan.split import make_plan

    uneven = make_plan(22, 4, world)
    accelerator.gradient_accumulation_steps = uneven.grad_accum_steps
    pool = [corpus[i] for i in range(200, 244)]  # two steps' worth
    sampled_sizes, sampled_got, step_indices = train_sampled_step(accelerator, pool, uneven)
    every_rank_sizes = [None] * world
    torch.distributed.all_gather_object(every_rank_sizes, sampled_sizes)
    if rank == 0:
        worst, targets = worst_difference(got, samples)
        planned_worst, _ = worst_difference(planned_got, planned)
        sampled_worst, _ = worst_difference(sampled_got, [pool[i] for i in step_indices])
        print(json.dumps({"world": world, "items": items, "targets": targets, "worst": worst,
                          "edge": result.max_micro_batch, "micro_batch": plan.micro_batch,
                          "accumulation": plan.grad_accum_steps,
                          "untouched": untouched,
                          "planned_worst": planned_worst, "sampled_sizes": every_rank_sizes,
                          "sampled_samples": len(set(step_indices)), "sampled_worst": sampled_worst}))
    accelerator.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
