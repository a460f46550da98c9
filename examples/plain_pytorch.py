"""gaplan's Python API in your own loop: your model, optimizer and DataLoader; gaplan's plan and loss.

    python examples/plain_pytorch.py            # with a given B* (seconds)
    python examples/plain_pytorch.py --probe --effective-batch 1024 --memory-limit 160MiB --steps 1
                                                # probe B* first (about two minutes on a small CPU)

The model is a plain ``nn.Module`` (a small causal transformer), the data a
``DataLoader`` of padded, variable-length sequences, one effective batch per
iteration. ``gaplan.make_plan`` splits each batch into micro-batches of at most B*
(unevenly when it must: 24 at B*=5 is 5,5,5,5,4), and ``gaplan.accumulate_gradients``
runs them with the token-exact loss: ``raw_loss`` returns the *sum* of token losses
and gaplan divides by the targets of the whole step, so the accumulated gradient is
the gradient of one big batch. The first line printed checks exactly that.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import gaplan
from gaplan.data import SyntheticCorpus

SEQ_LEN = 16
VOCAB = 256
IGNORE = -100


class TinyLM(nn.Module):
    """A two-layer causal transformer: the kind of model you would bring yourself."""

    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Embedding(SEQ_LEN, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        x = self.embed(input_ids) + self.position(torch.arange(length, device=input_ids.device))
        future = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).triu(1)  # True: not attended
        x = self.blocks(x, mask=future, src_key_padding_mask=attention_mask == 0, is_causal=True)
        return self.head(x)


def raw_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The *sum* of next-token losses of a micro-batch; gaplan divides it by the step's target count."""
    logits = model(batch["input_ids"], batch["attention_mask"])
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), batch["labels"][:, 1:].reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def mean_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The usual per-micro-batch mean, for comparison (``loss / accumulation_steps`` is the bug gaplan avoids)."""
    logits = model(batch["input_ids"], batch["attention_mask"])
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1), ignore_index=IGNORE)


def pad(sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Your collate function: right-pad with 0, labels -100 on padding."""
    longest = max(map(len, sequences))
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)] = torch.tensor(sequence)
        mask[row, :len(sequence)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE)}


def split(batch: dict[str, torch.Tensor], sizes: tuple[int, ...]) -> list[dict[str, torch.Tensor]]:
    """The plan's micro-batches of one effective batch, each cut to its own longest sequence."""
    parts, start = [], 0
    for size in sizes:
        part = {k: v[start:start + size] for k, v in batch.items()}
        width = int(part["attention_mask"].sum(1).max())
        parts.append({k: v[:, :width] for k, v in part.items()})
        start += size
    return parts


def make_workload() -> gaplan.CustomWorkload:
    """What the probe builds, in its worker process (``--probe``): the model and a worst-case batch of b samples.

    The probe measures memory, so it needs the same graph, not the same normalization.
    """
    def make_batch(size: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, VOCAB, (size, SEQ_LEN))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    return gaplan.CustomWorkload(TinyLM(), make_batch, loss=raw_loss, loss_is_scaled_for_ga=False)


def probe_max_micro_batch(effective_batch: int, memory_limit: str) -> int:
    from gaplan.core.units import parse_bytes

    here = os.path.dirname(os.path.abspath(__file__))  # the probe's worker imports this file as plain_pytorch
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    result = gaplan.probe(gaplan.WorkloadSpec(model="plain_pytorch:make_workload"), device="cpu",
                          memory_limit=parse_bytes(memory_limit), effective_batch=effective_batch)  # searches up to E
    print(f"probe: B* = {result.max_micro_batch}{' (capped)' if result.capped else ''} "
          f"in {len(result.trials)} trials, {result.wall_seconds:.0f} s")
    return result.max_micro_batch


def max_gradient_difference(model: nn.Module, micro_batches: list[dict], whole: dict, loss, scaled) -> float:
    """Largest difference between the accumulated gradient and the gradient of one big batch."""
    gaplan.accumulate_gradients(model, micro_batches, loss, "causal-lm", loss_is_scaled_for_ga=scaled)
    accumulated = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    gaplan.accumulate_gradients(model, [whole], raw_loss, "causal-lm")
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return max(float((a - r).abs().max()) for a, r in zip(accumulated, reference, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effective-batch", type=int, default=24)
    parser.add_argument("--max-micro-batch", type=int, default=5, help="B*, when not probing")
    parser.add_argument("--probe", action="store_true", help="find B* with gaplan.probe instead")
    parser.add_argument("--memory-limit", default="192MiB", help="the probe's budget")
    parser.add_argument("--steps", type=int, default=8)
    options = parser.parse_args()

    torch.manual_seed(0)
    corpus = SyntheticCorpus(SEQ_LEN, seed=0)
    sequences = [list(corpus[i].ids) for i in range(options.effective_batch * options.steps)]
    loader = DataLoader(sequences, batch_size=options.effective_batch, shuffle=True, drop_last=True, collate_fn=pad,
                        generator=torch.Generator().manual_seed(0))
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    max_micro = probe_max_micro_batch(options.effective_batch, options.memory_limit) if options.probe \
        else options.max_micro_batch
    plan = gaplan.make_plan(options.effective_batch, max_micro)
    print(f"plan: {plan.effective_batch} samples per step as micro-batches {','.join(map(str, plan.micro_batch_sizes))} "
          f"({plan.grad_accum_steps} accumulation steps, B* = {plan.micro_batch_cap})")

    first = next(iter(loader))
    exact = max_gradient_difference(model, split(first, plan.micro_batch_sizes), first, raw_loss, None)
    naive = max_gradient_difference(model, split(first, plan.micro_batch_sizes), first, mean_loss, False)
    print(f"accumulated vs one-batch gradient: max difference {exact:.1e} token-exact, {naive:.1e} with mean/steps")

    for step, batch in enumerate(loader, 1):
        result = gaplan.accumulate_gradients(model, split(batch, plan.micro_batch_sizes), raw_loss, "causal-lm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {result.loss:.4f} ({result.num_items_in_batch} target tokens)")
    print(f"final loss: {result.loss:.4f}")


if __name__ == "__main__":
    main()
