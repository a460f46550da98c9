"""Selective activation checkpointing: the blocks chosen recompute in backward, the others do not, and uneven
accumulation still trains the weights of one full batch."""

from __future__ import annotations

import pytest
import torch

from gaplan.core.checkpointing import parse_checkpointing
from gaplan.core.errors import GaplanError
from gaplan.core.tasks import CAUSAL_LM
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import WorkloadSpec, build_workload
from gaplan.workload.checkpointing import checkpointing_blocks
from tests.tolerances import assert_close_at_scale, relative_difference

from .test_loss import padded_batches


def forward_calls(spec: WorkloadSpec) -> list[int]:
    """How often each block's first submodule ran in one micro-step, forward and backward (2: recomputed)."""
    workload = build_workload(spec, "cpu", seed=0)
    blocks = checkpointing_blocks(workload.model)
    calls = [0] * len(blocks)
    for i, block in enumerate(blocks):
        first = next(block.children())
        first.register_forward_hook(lambda *args, i=i: calls.__setitem__(i, calls[i] + 1))
    _, parts = padded_batches(CAUSAL_LM, (2,), seq_len=spec.seq_len, seed=0)
    accumulate_gradients(workload.model, parts, workload.raw_loss, workload.task)
    return calls


@pytest.mark.parametrize("value, expected", [("off", [1, 1, 1, 1]), ("on", [2, 2, 2, 2]), ("ops", [2, 2, 2, 2]),
                                             ("every:2", [2, 1, 2, 1]), ("layers:3", [2, 2, 2, 1]),
                                             ("every:4", [2, 1, 1, 1])])
def test_only_the_chosen_blocks_run_again_in_backward(value, expected):
    assert forward_calls(WorkloadSpec(model="tiny-gpt2", seq_len=16, grad_checkpointing=parse_checkpointing(value))) == expected


def test_an_encoder_decoders_blocks_count_encoder_first():
    spec = WorkloadSpec(model="tiny-t5", seq_len=16, grad_checkpointing=parse_checkpointing("layers:5"))
    model = build_workload(spec, "meta").model
    assert [b.gradient_checkpointing for b in checkpointing_blocks(model)] == [True] * 5 + [False] * 3


@pytest.mark.parametrize("value", ["every:5", "layers:5"])
def test_more_blocks_than_the_model_has_is_one_line(value):
    with pytest.raises(GaplanError) as caught:
        build_workload(WorkloadSpec(model="tiny-gpt2", seq_len=16, grad_checkpointing=parse_checkpointing(value)), "meta")
    assert "model's 4" in str(caught.value) and "\n" not in str(caught.value)


def test_a_model_without_per_block_layers_takes_only_on_or_off():
    with pytest.raises(GaplanError, match="no per-block checkpointing layers.*use on or off"):
        build_workload(WorkloadSpec(model="examples.custom_model:make_cnn",
                                    grad_checkpointing=parse_checkpointing("every:2")), "cpu")


def train_steps(spec: WorkloadSpec, steps: list[tuple[tuple[int, ...], int]]) -> dict[str, torch.Tensor]:
    """Weights after SGD steps over micro-batches of the given sizes, in float64 and in training mode (a block
    checkpoints only while training)."""
    workload = build_workload(spec, "cpu", seed=0)
    workload.model.double()
    for sizes, seed in steps:
        _, parts = padded_batches(CAUSAL_LM, sizes, seq_len=spec.seq_len, seed=seed)
        accumulate_gradients(workload.model, parts, workload.raw_loss, workload.task)
        workload.optimizer.step()
        workload.optimizer.zero_grad(set_to_none=True)
    return {k: v.clone() for k, v in workload.model.state_dict().items()}


@pytest.mark.slow
def test_uneven_accumulation_with_every_other_block_checkpointed_trains_the_weights_of_one_full_batch():
    """9 + 7 and 6 + 5 + 5 with every:2 give the weights of one plain batch of 16 (no checkpointing) each step."""
    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="sgd", lr=0.5, grad_checkpointing=parse_checkpointing("every:2"))
    accumulated = train_steps(spec, [((9, 7), 0), ((6, 5, 5), 1)])
    whole = train_steps(WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="sgd", lr=0.5), [((16,), 0), ((16,), 1)])
    start = {k: v.double() for k, v in build_workload(spec, "cpu", seed=0).model.state_dict().items()}
    assert max(relative_difference(whole[k], start[k]) for k in whole if start[k].abs().max() > 0) > 1e-3
    for key in whole:
        assert_close_at_scale(accumulated[key], whole[key], msg=key)


def _gradients(value: str) -> dict[str, torch.Tensor]:
    spec = WorkloadSpec(model="tiny-gpt2", seq_len=32, optimizer="sgd", grad_checkpointing=parse_checkpointing(value))
    workload = build_workload(spec, "cpu", seed=0)
    workload.model.eval()  # no dropout: the same function each way
    torch.manual_seed(0)
    workload.raw_loss(workload.model, workload.make_batch(4)).backward()
    return {name: p.grad.clone() for name, p in workload.model.named_parameters()}


def test_op_level_checkpointing_runs_torchs_selective_policy_and_trains_the_same_gradients():
    """ops: every block under torch's selective checkpoint contexts (torchtitan's policy); backward gives off's
    gradients. (What it keeps is measured by the estimate's trace and a real trial: tests/estimate/test_levers.py.)"""
    from gaplan.workload.op_checkpointing import MATMULS, op_policy

    policy, ctx = op_policy(), type("Ctx", (), {"is_recompute": False})()
    kept = [policy(ctx, op) for op in [*MATMULS, *MATMULS, torch.ops.aten.gelu.default]]
    assert [k.name for k in kept] == ["MUST_SAVE", "PREFER_RECOMPUTE", "MUST_SAVE", "PREFER_RECOMPUTE",
                                      "PREFER_RECOMPUTE"]
    off, ops = _gradients("off"), _gradients("ops")
    for name, grad in off.items():
        assert_close_at_scale(ops[name], grad, msg=name)
