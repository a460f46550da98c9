"""A finite corpus and a small language model trained on it, with the exact noise scale from every per-sample gradient.

The brute force the noise-scale tests hold gaplan's reading to (issue 58): ``N`` token sequences of one length from a
random Markov chain, a next-token MLP trained on them full-batch (Adam) until the gradient's mean is small against its
spread (``B_simple`` a given share of ``N``), and at that point every sample's gradient of its own mean token loss,
in float64. The exact figures are the population's:

    G = mean_i g_i,  tr(S) = mean_i |g_i - G|^2 (divided by N),  B_simple = tr(S) / |G|^2  (in samples)

which is what a batch mean of independent draws from these N samples would have as its variance per sample. Every
sample has as many targets, so gaplan's items (targets) and samples differ by one factor, ``length - 1``.
:func:`workload` hands the model to gaplan's own causal-LM data path (the corpus, each epoch's permutation, the
collation, the token-exact loss, the meter).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from gaplan.core.tasks import CAUSAL_LM
from gaplan.data import Sample
from gaplan.workload.build import CustomWorkload, Workload, WorkloadSpec
from gaplan.workload.loss import summed_token_loss


def corpus(count: int, length: int, vocab: int, seed: int = 0, choices: int = 3) -> list[Sample]:
    """``count`` sequences of ``length`` tokens in ``1..vocab-1`` (0 is the padding id) from a random Markov chain
    whose every token has ``choices`` likely successors: learnable, so training makes the mean gradient small."""
    generator = torch.Generator().manual_seed(seed)
    successors = torch.randint(1, vocab, (vocab, choices), generator=generator)
    rows = []
    for _ in range(count):
        token = int(torch.randint(1, vocab, (1,), generator=generator))
        row = [token]
        for _ in range(length - 1):
            token = int(successors[token, int(torch.randint(0, choices, (1,), generator=generator))])
            row.append(token)
        rows.append(Sample(tuple(row)))
    return rows


class TinyLM(nn.Module):
    """A next-token MLP: each position's logits from its own token (embedding, one tanh layer, the head). Its output
    has ``.logits`` as a transformers causal LM's, so gaplan's token-exact loss takes it as it takes one."""

    def __init__(self, vocab: int, width: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.hidden = nn.Linear(width, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        return SimpleNamespace(logits=self.head(torch.tanh(self.hidden(self.embed(input_ids)))))


def model(vocab: int, seed: int = 0, **sizes: int) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(vocab, **sizes)


def workload(net: TinyLM, seq_len: int) -> Workload:
    """``net`` as gaplan's causal-LM workload: its loss is the one gaplan builds for a transformers model (the
    micro-batch's summed token loss, normalized by the step's targets), trained by SGD at 1e-12 (the point stays)."""
    spec = WorkloadSpec(model="tiny-gpt2", seq_len=seq_len, optimizer="sgd", lr=1e-12)

    def raw_loss(module: nn.Module, batch: dict) -> torch.Tensor:
        return summed_token_loss(module(input_ids=batch["input_ids"]).logits, batch, CAUSAL_LM)

    return Workload(spec, net, torch.optim.SGD(net.parameters(), lr=1e-12), CAUSAL_LM, seq_len,
                    lambda size: {}, raw_loss, None, torch.device("cpu"))


def _ids(samples: list[Sample]) -> torch.Tensor:
    return torch.tensor([s.ids for s in samples])


def mean_token_loss(net, ids: torch.Tensor) -> torch.Tensor:
    """Each row's mean cross-entropy over its ``length - 1`` next-token targets, averaged over the rows."""
    logits = net(input_ids=ids).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def train_until(net, samples: list[Sample], share: float, lr: float = 3e-3, most: int = 400
                ) -> tuple[int, tuple[float, float, float]]:
    """Full-batch Adam on the corpus, one step at a time, until the exact ``B_simple`` reaches ``share`` of the
    corpus (the gradient's mean falls as the model learns; its per-sample spread does not). Returns the steps taken
    and :func:`exact_noise` there."""
    ids = _ids(samples)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    for step in range(1, most + 1):
        optimizer.zero_grad(set_to_none=True)
        mean_token_loss(net, ids).backward()
        optimizer.step()
        exact = exact_noise(net, samples)
        if exact[2] >= share * len(samples):
            optimizer.zero_grad(set_to_none=True)
            return step, exact
    raise AssertionError(f"B_simple did not reach {share} x {len(samples)} in {most} steps")


def exact_noise(net, samples: list[Sample]) -> tuple[float, float, float]:
    """``(|G|^2, tr(S), B_simple)`` per sample, from every per-sample gradient in float64 (``torch.func``)."""
    from torch.func import functional_call, grad, vmap

    double = {name: p.detach().double() for name, p in net.named_parameters()}
    net64 = net.double()

    def loss_of(params, ids):
        return mean_token_loss(lambda **kw: functional_call(net64, params, (), kw), ids.unsqueeze(0))

    try:
        per_sample = vmap(grad(loss_of), in_dims=(None, 0))(double, _ids(samples))
    finally:
        net.float()
    flat = torch.cat([g.reshape(len(samples), -1) for g in per_sample.values()], dim=1)
    mean = flat.mean(0)
    grad_sq = float(mean.square().sum())
    grad_var = float((flat - mean).square().sum(1).mean())
    return grad_sq, grad_var, grad_var / grad_sq


def regression(count: int = 64, dim: int = 6, offset: float = 0.05, draws: str | int | None = None, seed: int = 0
               ) -> tuple[CustomWorkload, tuple[float, float, float]]:
    """A ``module:function`` workload on a fixed dataset of ``count`` samples whose ``make_batch`` takes each call's
    samples without replacement (``torch.randperm``), declaring ``draws``; held at the least-squares fit moved by
    ``offset`` along its first axis. A sample's gradient of ``(w . x - y)^2 / 2`` is ``(w . x - y) x`` exactly, so
    the exact ``(|G|^2, tr(S), B_simple)`` come with it."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, dim, generator=generator, dtype=torch.float64)
    y = x @ torch.linspace(-1, 1, dim, dtype=torch.float64) + torch.randn(count, generator=generator,
                                                                            dtype=torch.float64)
    fit = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1)
    fit[0] += offset
    per_sample = (x @ fit - y).unsqueeze(1) * x
    mean = per_sample.mean(0)
    exact = (float(mean.square().sum()), float((per_sample - mean).square().sum(1).mean()))
    model = nn.Linear(dim, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(fit.unsqueeze(0))

    def make_batch(size: int) -> dict:
        chosen = torch.randperm(count)[:size]
        return {"x": x[chosen], "y": y[chosen]}

    def loss(module: nn.Module, batch: dict) -> torch.Tensor:
        return 0.5 * (module(batch["x"]).squeeze(-1) - batch["y"]).pow(2).mean()

    workload = CustomWorkload(model, make_batch, loss, loss_is_scaled_for_ga=False, draws=draws)
    return workload, (*exact, exact[1] / exact[0])


REGRESSION_OFFSET = 0.45  # B_simple = 25.1 of the 64 samples: 0.39 of them


def regression_declared() -> CustomWorkload:
    """``--model tests.training.finite_corpus:regression_declared``: says it draws without replacement from 64."""
    return regression(offset=REGRESSION_OFFSET, draws=64)[0]


def regression_undeclared() -> CustomWorkload:
    """The same workload, saying nothing of how it draws."""
    return regression(offset=REGRESSION_OFFSET)[0]


def regression_shuffled() -> CustomWorkload:
    """A declaration gaplan does not know (for the refusal's test)."""
    return regression(offset=REGRESSION_OFFSET, draws="shuffled")[0]
