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


def main():
    import accelerate

    corpus = SyntheticCorpus(32, seed=0)
    samples = [corpus[i] for i in range(14)]  # 7 a rank, split 3 + 2 + 2: uneven, and padded differently
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=3)
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = samples[rank * 7:(rank + 1) * 7]
    micro_batches = [collate(mine[s:s + n], TASK) for s, n in ((0, 3), (3, 2), (5, 2))]
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    items = count_step_items(accelerator, micro_batches, TASK)
    got = None
    for batch in micro_batches:
        with accelerator.accumulate(model):
            accelerator.backward(step_loss(accelerator, summed_token_loss(model(**batch).logits, batch, TASK), items))
            if accelerator.sync_gradients:
                got = {n: p.grad.detach().clone() for n, p in accelerator.unwrap_model(model).named_parameters()}
            optimizer.step()
            optimizer.zero_grad()
    if rank == 0:
        reference = tiny_model()
        whole = collate(samples, TASK)
        targets = (whole["labels"][:, 1:] != -100).sum()
        (summed_token_loss(reference(**whole).logits, whole, TASK) / targets).backward()
        worst = max(((got[n] - p.grad).abs().max() / p.grad.abs().max()).item()
                    for n, p in reference.named_parameters())
        print(json.dumps({"world": world, "items": items, "targets": int(targets), "worst": worst}))
    # The model's reducer holds the gloo group in reference cycles: freed now, while the interpreter is whole, not at
    # its teardown, where freeing a gloo group can abort a rank that has finished.
    del model, optimizer
    import gc

    gc.collect()
    accelerator.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
