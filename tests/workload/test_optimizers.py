"""The optimizers (issue 47, item 1): their states counted exactly, token-exact training, one-line refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.core.tasks import CAUSAL_LM
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import WorkloadSpec, build_workload
from gaplan.workload.loss import count_targets
from gaplan.workload.optimizer_states import parameter_state_bytes, shared_state_bytes, state_bytes
from gaplan.workload.optimizers import Lion, optimizer_state_bytes
from gaplan.workload.spec import OPTIMIZERS
from gaplan.workload.state_size import tensor_bytes
from tests.tolerances import assert_close_at_scale, relative_difference

from .test_loss import padded_batches

ON_CPU = ("adamw", "adamw-fused", "adamw-forloop", "adamw-8bit", "adafactor", "lion",
          "sgd")  # paged-adamw-8bit pages through CUDA only


def real_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of every tensor in the optimizer's state (a storage shared by parameters once), AdamW's step
    counters aside (host scalars on CUDA, never counted)."""
    states = [{key: value for key, value in state.items() if key != "step"} for state in optimizer.state.values()]
    return tensor_bytes(states)


def test_every_optimizer_has_a_default_learning_rate_and_the_cli_offers_them_all():
    from gaplan.cli.options import workload_options

    for name in OPTIMIZERS:
        assert WorkloadSpec(optimizer=name).learning_rate > 0
    option = next(p for p in workload_options(lambda **kw: None).__click_params__ if p.name == "optimizer")
    assert option.metavar == "|".join(OPTIMIZERS)


@pytest.mark.parametrize("name", ON_CPU)
@pytest.mark.parametrize("model,weights_dtype", [("tiny-gpt2", "fp32"), ("tiny-llama", "bf16")])
def test_the_counted_state_is_the_real_optimizers_state_after_one_step(name, model, weights_dtype):
    spec = WorkloadSpec(model=model, seq_len=16, optimizer=name, weights_dtype=weights_dtype,
                        dtype="bf16" if weights_dtype == "bf16" else "fp32")
    workload = build_workload(spec, "cpu")
    with workload.autocast():
        loss = workload.raw_loss(workload.model, workload.make_batch(2))
    loss.backward()
    workload.optimizer.step()
    counted = optimizer_state_bytes(workload.model, name)
    assert counted == real_state_bytes(workload.optimizer), name
    assert (counted > 0) == (name != "sgd")
    # and the static bytes a trial checks before any activation count the same states
    params = [p for p in workload.model.parameters()]
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    assert workload.static_bytes() == sum(p.numel() * p.element_size() for p in params) + trained + counted


def test_the_adamw_implementations_are_torchs_kernels_with_one_update():
    """adamw-fused and adamw-forloop are torch's AdamW with fused=True and foreach=False: two steps give the default's
    weights (float64, so AdamW's normalization does not turn rounding noise into whole steps)."""
    for name, flags in (("adamw-fused", {"fused": True}), ("adamw-forloop", {"foreach": False})):
        optimizer = build_workload(WorkloadSpec(model="tiny-llama", seq_len=16, optimizer=name), "meta").optimizer
        assert isinstance(optimizer, torch.optim.AdamW) and all(optimizer.defaults[k] == v for k, v in flags.items())
    steps = [((4,), 0), ((3, 2), 1)]
    default = train_steps(WorkloadSpec(model="tiny-llama", seq_len=16, optimizer="adamw"), steps)
    for name in ("adamw-fused", "adamw-forloop"):
        weights = train_steps(WorkloadSpec(model="tiny-llama", seq_len=16, optimizer=name), steps)
        for key in default:
            assert_close_at_scale(weights[key], default[key], msg=f"{name} {key}")


def test_the_8bit_count_has_the_block_absmax_the_small_parameter_fallback_and_one_pair_of_maps():
    assert parameter_state_bytes((64, 64), 4, "adamw-8bit") == 2 * 4096 + 2 * 16 * 4  # 16 blocks of 256, 2 moments
    assert parameter_state_bytes((4097,), 4, "adamw-8bit") == 2 * 4097 + 2 * 17 * 4  # a partial block counts
    assert parameter_state_bytes((4095,), 2, "adamw-8bit") == 2 * 4095 * 4  # under 4096: two float32 moments
    assert shared_state_bytes([4095], "adamw-8bit") == 0
    assert shared_state_bytes([4096, 10_000], "paged-adamw-8bit") == 2 * 256 * 4
    assert state_bytes([((64, 64), 4), ((100, 100), 4)], "adamw-8bit") == (8192 + 128) + (20_000 + 2 * 40 * 4) + 2048


def test_adafactor_counts_a_row_and_a_column_per_matrix_and_a_full_second_moment_per_vector():
    assert parameter_state_bytes((300, 100), 4, "adafactor") == (300 + 100 + 1) * 4  # + the RMS scalar
    assert parameter_state_bytes((2, 3, 5), 2, "adafactor") == (2 * 3 + 2 * 5 + 1) * 4  # always float32
    assert parameter_state_bytes((7,), 4, "adafactor") == (7 + 1) * 4
    assert parameter_state_bytes((7, 3), 2, "lion") == 21 * 2 and parameter_state_bytes((7, 3), 2, "sgd") == 0


def test_lion_takes_the_sign_of_the_interpolated_momentum_then_moves_the_momentum():
    """Chen et al. 2023, Algorithm 2, by hand: two steps with betas (0.9, 0.99) and decoupled weight decay."""
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    lion = Lion([weight], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    weight.grad = torch.tensor([0.3, -0.2, 0.0])
    lion.step()
    # m = 0: c = 0.1 g, sign(c) = (1, -1, 0); w = w (1 - 0.1 * 0.5) - 0.1 sign(c); m = 0.01 g
    torch.testing.assert_close(weight.data, torch.tensor([0.95 - 0.1, -1.9 + 0.1, 0.475]))
    torch.testing.assert_close(lion.state[weight]["exp_avg"], torch.tensor([0.003, -0.002, 0.0]))
    weight.grad = torch.tensor([-0.001, -0.5, 0.2])
    lion.step()
    # c = 0.9 m + 0.1 g = (0.0026, -0.0518, 0.02): signs (1, -1, 1), though the first gradient turned negative
    torch.testing.assert_close(weight.data, torch.tensor([0.85 * 0.95 - 0.1, -1.8 * 0.95 + 0.1, 0.475 * 0.95 - 0.1]))
    torch.testing.assert_close(lion.state[weight]["exp_avg"],
                               torch.tensor([0.99 * 0.003 - 0.01 * 0.001, 0.99 * -0.002 - 0.005, 0.002]))


def train_steps(spec: WorkloadSpec, steps: list[tuple[tuple[int, ...], int]], naive: bool = False) -> dict[str, torch.Tensor]:
    """Weights after optimizer steps, each over micro-batches of the given sizes (padded, uneven targets), in float64
    (the optimizer keeps the same parameter objects). ``naive``: each micro-batch's mean loss, divided by the
    accumulation steps (the loss most tools use), instead of gaplan's."""
    workload = build_workload(spec, "cpu", seed=0)
    workload.model.eval()  # no dropout: the same function on both sides
    workload.model.double()

    def mean_loss(model, batch):
        return workload.raw_loss(model, batch) / count_targets(batch, CAUSAL_LM)

    for sizes, seed in steps:
        _, parts = padded_batches(CAUSAL_LM, sizes, seq_len=spec.seq_len, seed=seed)
        if naive:
            accumulate_gradients(workload.model, parts, mean_loss, workload.task, loss_is_scaled_for_ga=False)
        else:
            accumulate_gradients(workload.model, parts, workload.raw_loss, workload.task)
        workload.optimizer.step()
        workload.optimizer.zero_grad(set_to_none=True)
    return {k: v.clone() for k, v in workload.model.state_dict().items()}


def worst_difference(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    return max(relative_difference(actual[k], expected[k]) for k in expected if expected[k].abs().max() > 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ON_CPU)
def test_uneven_accumulation_trains_the_weights_of_one_full_batch(name):
    """Two optimizer steps of 16 padded samples, as micro-batches 9 + 7 and 6 + 5 + 5, and as one batch of 16: the
    same weights, for every optimizer that runs on the CPU; the usual mean of micro-batch means does not give them.

    In float64: AdamW's and Lion's normalizations turn an element whose gradient sits at the rounding floor into a
    whole step of either sign. In fp32, plain AdamW on this Llama left 6 of an MLP weight's 176,128 elements 3e-5 of
    its scale apart; and GPT-2's key bias, whose gradient is zero but for rounding, takes Lion's +-lr at random even in
    float64 (so a Llama, which has no biases)."""
    spec = WorkloadSpec(model="tiny-llama", seq_len=24, optimizer=name, lr=0.5 if name == "sgd" else None)
    accumulated = train_steps(spec, [((9, 7), 0), ((6, 5, 5), 1)])
    whole = train_steps(spec, [((16,), 0), ((16,), 1)])
    naive = train_steps(spec, [((9, 7), 0), ((6, 5, 5), 1)], naive=True)
    start = {k: v.double() for k, v in build_workload(spec, "cpu", seed=0).model.state_dict().items()}
    assert worst_difference(whole, start) > 1e-3  # the steps moved the weights
    for key in whole:
        assert_close_at_scale(accumulated[key], whole[key], msg=f"{name} {key}")
    assert worst_difference(naive, whole) > 1e-3, "the check must tell the wrong loss from the right one"


def test_an_unknown_optimizer_is_one_line_naming_the_option():
    with pytest.raises(OptionError) as exc:
        WorkloadSpec(optimizer="adam8").validate()
    assert "optimizer" in exc.value.fields and "adamw-8bit" in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.for_cli().startswith("unknown --optimizer 'adam8'")


def test_paged_adamw_8bit_is_refused_on_the_cpu_and_built_on_meta_for_the_estimate():
    spec = WorkloadSpec(optimizer="paged-adamw-8bit")
    with pytest.raises(OptionError) as exc:
        build_workload(spec, "cpu")
    assert "CUDA unified memory" in str(exc.value) and "adamw-8bit" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(OptionError):
        spec.check_device("cpu")
    spec.check_device("cuda:0")
    meta = build_workload(spec, "meta")
    assert type(meta.optimizer).__name__ == "PagedAdamW8bit"


def test_a_missing_bitsandbytes_is_one_line_with_the_install_command(monkeypatch):
    import importlib.util
    import sys

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes raises ImportError
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real_find_spec(name, *a))
    spec = WorkloadSpec(optimizer="adamw-8bit")
    for attempt in (lambda: spec.check_device("cuda"), lambda: build_workload(spec, "meta")):
        with pytest.raises(GaplanError) as exc:
            attempt()
        assert str(exc.value) == "optimizer adamw-8bit needs bitsandbytes: pip install bitsandbytes"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fsdp_takes_torchs_adamw_in_each_kernel_and_sgd_and_refuses_the_others_in_one_line(name):
    """FSDP2's parameters are DTensor shards: torch's AdamW (foreach, fused or one parameter at a time) and SGD step
    them (tests/cli/test_train_fsdp.py trains each to one process's weights); bitsandbytes', Adafactor's and Lion's
    states are not sharded tensors."""
    spec = dataclasses.replace(WorkloadSpec(optimizer=name), parallel="fsdp")
    if name in ("adamw", "adamw-fused", "adamw-forloop", "sgd"):
        assert spec.validate() == spec
    else:
        with pytest.raises(OptionError, match=f"optimizer {name} with parallel fsdp is not supported") as exc:
            spec.validate()
        assert {"optimizer", "parallel"} <= set(exc.value.fields)
