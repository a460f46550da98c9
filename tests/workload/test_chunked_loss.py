"""The chunked loss (issue 47, item 2): the plain loss's number and gradients, token-exact under uneven accumulation,
no whole [B, T, V] logits, and one-line refusals where it does not apply."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.core.tasks import CAUSAL_LM, SEQ2SEQ_LM
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import WorkloadSpec, build_workload
from gaplan.workload.chunked_loss import default_chunk_tokens
from tests.tolerances import assert_close_at_scale, relative_difference

from .test_loss import grads, padded_batches, step_gradient


def built(model: str, loss: str, **fields) -> object:
    workload = build_workload(WorkloadSpec(model=model, seq_len=24, optimizer="sgd", loss=loss, **fields), "cpu", seed=0)
    workload.model.eval()  # no dropout: the same function on both sides
    return workload


@pytest.mark.parametrize("model,task", [("tiny-gpt2", CAUSAL_LM), ("tiny-llama", CAUSAL_LM), ("tiny-t5", SEQ2SEQ_LM)])
def test_the_chunked_loss_is_the_plain_loss_and_its_gradient(model, task):
    """Padded samples (targets of different counts), chunks of 7 positions (not a divisor of any length here)."""
    plain, chunked = built(model, "plain"), built(model, "chunked:7")
    whole, _ = padded_batches(task, (5,))
    plain_loss = plain.raw_loss(plain.model, whole)
    chunked_loss = chunked.raw_loss(chunked.model, whole)
    torch.testing.assert_close(chunked_loss, plain_loss, rtol=1e-6, atol=0)
    plain_loss.backward()
    chunked_loss.backward()
    assert_close_at_scale(grads(chunked.model), grads(plain.model))


def test_uneven_accumulation_with_the_chunked_loss_trains_the_plain_full_batchs_weights():
    """Two SGD steps: micro-batches 9 + 7 and 6 + 5 + 5 with chunks of 5 positions against one plain batch of 16 a step:
    the same weights within 1e-5 of their scale; the gradient of the uneven split alone, too."""
    plain, chunked = built("tiny-llama", "plain", lr=0.5), built("tiny-llama", "chunked:5", lr=0.5)
    start = {k: v.clone() for k, v in plain.model.state_dict().items()}
    for seed, sizes in ((0, (9, 7)), (1, (6, 5, 5))):
        whole, parts = padded_batches(CAUSAL_LM, sizes, seed=seed)
        if seed == 0:
            assert_close_at_scale(step_gradient(chunked, parts), step_gradient(plain, [whole]))
        for workload, batches in ((plain, [whole]), (chunked, parts)):
            workload.model.zero_grad(set_to_none=True)
            accumulate_gradients(workload.model, batches, workload.raw_loss, workload.task)
            workload.optimizer.step()
    moved = max(relative_difference(v, start[k]) for k, v in plain.model.state_dict().items())
    assert moved > 1e-3, "the steps must move the weights for the comparison to say anything"
    for (key, a), b in zip(chunked.model.state_dict().items(), plain.model.state_dict().values(), strict=True):
        assert_close_at_scale(a, b, msg=key)


class LargestLogits(TorchDispatchMode):
    """The most rows of any tensor made with the vocabulary as its last dimension, but the head's weight's size
    (its transpose, for the product, and its gradient's are [H, V])."""

    def __init__(self, vocab_size: int, weight_numel: int) -> None:
        super().__init__()
        self.vocab_size, self.weight_numel, self.rows = vocab_size, weight_numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(tensor, torch.Tensor) and tensor.dim() >= 1 and tensor.shape[-1] == self.vocab_size
                    and tensor.numel() != self.weight_numel):
                self.rows = max(self.rows, tensor.numel() // self.vocab_size)
        return out


@pytest.mark.parametrize("loss,most_rows", [("plain", 4 * 24), ("chunked:16", 16)])
def test_the_whole_logits_never_exist_in_forward_or_backward(loss, most_rows):
    workload = built("tiny-gpt2", loss)
    batch = workload.make_batch(4)
    with LargestLogits(workload.vocab_size, workload.model.lm_head.weight.numel()) as seen:
        workload.raw_loss(workload.model, batch).backward()
    assert seen.rows == most_rows


def test_the_default_chunk_keeps_one_chunks_fp32_logits_to_16_mib():
    assert default_chunk_tokens(32_000) == 128 and default_chunk_tokens(128_256) == 32
    assert default_chunk_tokens(8192) == 512 and default_chunk_tokens(10**9) == 1
    assert built("tiny-gpt2", "chunked").info["loss_chunk_tokens"] == 512


@pytest.mark.parametrize("loss", ["chunked:0", "chunked:x", "chunked:", "plain:8", "fused"])
def test_a_bad_loss_is_one_line_naming_the_option(loss):
    with pytest.raises(OptionError) as exc:
        WorkloadSpec(loss=loss).validate()
    assert exc.value.fields == ("loss",) and "\n" not in str(exc.value)
    assert exc.value.for_cli().startswith(f"unknown --loss {loss!r}")


@pytest.mark.parametrize("model,task", [("tiny-bert-cls", "classification"), ("tiny-bert-mlm", "masked-lm")])
def test_the_chunked_loss_is_refused_where_there_is_no_lm_head_loss(model, task):
    with pytest.raises(OptionError) as exc:
        WorkloadSpec(model=model, loss="chunked").validate()
    assert f"trains as {task}" in str(exc.value) and "use --loss plain" in exc.value.for_cli()


def test_the_chunked_loss_is_refused_for_a_function_model_and_for_fsdp():
    with pytest.raises(OptionError) as exc:
        WorkloadSpec(model="mypkg.models:make", loss="chunked").validate()
    assert "module:function" in str(exc.value) and exc.value.fields == ("loss",)
    with pytest.raises(OptionError) as exc:
        dataclasses.replace(WorkloadSpec(loss="chunked:64"), parallel="fsdp").validate()
    assert set(exc.value.fields) == {"loss", "parallel"}


def test_a_folder_model_is_checked_once_its_task_is_known_and_a_bias_after_the_head_is_refused(tmp_path):
    from ..model_folders import make_bart_folder

    folder = make_bart_folder(str(tmp_path / "bart"), vocab_size=256)
    with pytest.raises(GaplanError) as exc:
        build_workload(WorkloadSpec(model=folder, seq_len=24, loss="chunked"), "cpu")
    assert "final_logits_bias" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(OptionError) as exc:
        build_workload(WorkloadSpec(model=folder, task="classification", seq_len=24, loss="chunked"), "meta")
    assert "trains as classification" in str(exc.value)
