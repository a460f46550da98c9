"""gaplan.estimate and gaplan.targets: fake-tensor traces against real CPU trials, the device model, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gaplan.errors import DoesNotFit, GaplanError
from gaplan.targets import list_targets, lookup_target

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The shape of Llama-2-7B (6.74B parameters: 27 GB of fp32 weights alone), from its config, no download.
LLAMA_7B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    "tie_word_embeddings": False,
}


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


# --- targets ---------------------------------------------------------------------------------------------------


def test_every_target_keeps_a_reserve_and_most_of_its_memory():
    targets = list_targets()
    assert {"h200", "h100-80gb", "a100-80gb", "a100-40gb", "l4", "t4", "rtx-4090"} <= {t.name for t in targets}
    for target in targets:
        assert 0 < target.usable_bytes < target.total_bytes
        assert target.total_bytes - target.usable_bytes == target.context_bytes + target.workspace_bytes
        assert target.usable_bytes > 0.9 * target.total_bytes
        assert json.loads(json.dumps(target.to_dict()))["usable_bytes"] == target.usable_bytes


def test_lookup_target_by_name_and_alias():
    h100 = lookup_target("h100-80gb")
    assert h100.total_bytes == 81_559 * 2**20
    assert lookup_target("H100") is h100
    assert lookup_target("a100_40gb").name == "a100-40gb"
    assert h100.workspace_bytes > lookup_target("a100-80gb").workspace_bytes  # Hopper's 32 MiB cuBLAS workspaces


def test_unknown_target_is_one_line_naming_the_known_ones():
    with pytest.raises(GaplanError) as exc:
        lookup_target("h900")
    message = one_line(exc)
    assert "unknown target 'h900'" in message and "h100-80gb" in message


# --- bad input ---------------------------------------------------------------------------------------------------


def test_estimate_rejects_bad_input_in_one_line(tmp_path):
    from gaplan.estimate import estimate
    from gaplan.workload import WorkloadSpec

    cases = [
        (dict(spec=WorkloadSpec(model="tiny-gpt2"), target="h900"), "unknown target"),
        (dict(spec=WorkloadSpec(model=str(tmp_path))), "without a config.json"),
        (dict(spec=WorkloadSpec(model="tiny-gpt2", seq_len=4096)), "longer than the model's 1024 positions"),
        (dict(spec=WorkloadSpec(model="tiny-gpt2"), target="t4", device_kind="cpu"), "does not apply to a CPU estimate"),
        (dict(spec=WorkloadSpec(model="tiny-gpt2"), device_kind="tpu"), "device kind"),
        (dict(spec=WorkloadSpec(model="tiny-gpt2"), memory_limit=0), "--memory-limit"),
        (dict(spec=WorkloadSpec(model="tiny-gpt2"), sizes=[2, 2]), "two different"),
        (dict(spec=WorkloadSpec(model="tiny-gpt2"), effective_batch=0), "effective batch"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(GaplanError) as exc:
            estimate(**kwargs)
        assert expected in one_line(exc), (kwargs, str(exc.value))


def test_a_model_too_big_for_the_budget_does_not_fit():
    from gaplan.estimate import estimate
    from gaplan.workload import WorkloadSpec

    with pytest.raises(DoesNotFit) as exc:
        estimate(WorkloadSpec(model="tiny-gpt2", seq_len=32), memory_limit=64 * 2**20, device_kind="cpu")
    assert "does not fit" in one_line(exc)
    assert exc.value.needed_bytes > 64 * 2**20


# --- the CUDA model ----------------------------------------------------------------------------------------------


def test_cuda_block_rounding():
    from gaplan.estimate import _cuda_block_bytes

    assert _cuda_block_bytes(0) == 0
    assert _cuda_block_bytes(1) == 512
    assert _cuda_block_bytes(512) == 512
    assert _cuda_block_bytes(513) == 1024
    assert _cuda_block_bytes(10 * 2**20 - 1) == 10 * 2**20  # 512-rounded, shares a segment
    assert _cuda_block_bytes(10 * 2**20 + 1) == 12 * 2**20  # its own segment, 2 MiB-rounded


def test_cuda_autocast_float32_ops_run_in_float32():
    import torch
    import torch.nn.functional as F

    from gaplan.estimate import _CudaAutocastFp32

    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = torch.nn.functional.linear(x, torch.randn(8, 8))
        assert low.dtype == torch.bfloat16
        assert F.layer_norm(low, (8,)).dtype == torch.bfloat16  # CPU autocast keeps it low
        with _CudaAutocastFp32():
            assert F.layer_norm(low, (8,)).dtype == torch.float32  # as CUDA autocast does
            assert F.softmax(low, -1).dtype == torch.float32
            assert torch.pow(low, 3.0).dtype == torch.float32
            assert (low ** 2).dtype == torch.float32
            assert F.gelu(low).dtype == torch.bfloat16  # not on the list
    with _CudaAutocastFp32():
        assert F.softmax(x.bfloat16(), -1).dtype == torch.bfloat16  # outside autocast nothing changes


def test_cuda_estimate_checks_its_edge_and_states_its_assumptions():
    from gaplan.estimate import estimate
    from gaplan.workload import WorkloadSpec

    limit = 512 * 2**20
    result = estimate(WorkloadSpec(model="tiny-gpt2", seq_len=32), memory_limit=limit, effective_batch=256)
    assert result.device_kind == "cuda" and result.target is None
    assert result.memory_limit_bytes == limit and 0 < result.usable_bytes < limit
    edge = result.max_micro_batch
    steps = {r.micro_batch: r for r in result.rows if r.phase == "step"}
    assert steps[edge].peak_bytes <= result.usable_bytes < steps[edge + 1].peak_bytes  # both sides traced
    assert result.peak_bytes == steps[edge].peak_bytes
    assert result.plan["max_micro_batch"] == edge and result.plan["effective_batch"] == 256
    assert result.plan["micro_batch"] <= edge
    assert result.line[1] > 0
    text = " ".join(result.assumptions)
    for phrase in ("512 bytes", "foreach=True", "CUDA context", "cuBLAS", "Attention"):
        assert phrase in text, phrase
    assert result.param_count > 0 and result.static_bytes > 0 and result.trace_seconds > 0
    data = json.loads(json.dumps(result.to_dict()))
    assert data["max_micro_batch"] == edge and data["rows"][0]["phase"] == "optimizer-step"
    # Every tensor is counted at its allocator block: the 0-d AdamW step counters take 512 bytes each.
    micro = next(r for r in result.rows if r.phase == "micro-steps")
    params = [p for p in _model_parameters("tiny-gpt2")]
    assert micro.optimizer_states >= 8 * sum(p.numel() for p in params) + 512 * len(params)


def test_target_estimate_bf16_uses_the_targets_usable_memory():
    from gaplan.estimate import estimate
    from gaplan.workload import WorkloadSpec

    result = estimate(WorkloadSpec(model="tiny-llama", seq_len=64, dtype="bf16"), target="t4", effective_batch=64,
                      max_micro_batch=8)
    assert result.target == "t4"
    assert result.usable_bytes == lookup_target("t4").usable_bytes
    assert result.max_micro_batch == 8 and result.capped  # a tiny model on 16 GB: the cap fits
    assert result.plan["grad_accum_steps"] == 8
    assert any("Mixed precision (bf16" in a for a in result.assumptions)


def _model_parameters(preset: str):
    from gaplan.workload import WorkloadSpec, build_workload

    return [p for p in build_workload(WorkloadSpec(model=preset), "meta").model.parameters() if p.requires_grad]


# --- CPU: the estimate against real trials --------------------------------------------------------------------


def test_cpu_trace_counts_the_optimizer_states_of_the_steady_state():
    from gaplan.estimate import trace_steps
    from gaplan.workload import WorkloadSpec

    (row,) = trace_steps(WorkloadSpec(model="tiny-llama", seq_len=32), [4])
    params = _model_parameters("tiny-llama")
    # AdamW keeps two fp32 tensors per parameter and a 4-byte step counter per parameter tensor.
    assert row.optimizer_states == 8 * sum(p.numel() for p in params) + 4 * len(params)
    assert row.gradients == sum(p.numel() * 4 for p in params)
    assert row.activations > 0


@pytest.mark.heavy
# Sizes where activations set the peak, and one (bert-cls at 2) where the optimizer step does.
@pytest.mark.slow
@pytest.mark.parametrize(("preset", "micro_batch"), [("tiny-gpt2", 8), ("tiny-llama", 4), ("tiny-bert-mlm", 8),
                                                     ("tiny-bert-cls", 2)])
def test_cpu_estimate_is_within_3_percent_of_a_real_trial(preset, micro_batch):
    from gaplan.estimate import trace_steps
    from gaplan.probe import WorkerProcess
    from gaplan.workload import WorkloadSpec

    spec = WorkloadSpec(model=preset, seq_len=32)
    (row,) = trace_steps(spec, [micro_batch], device_kind="cpu", threads=2)
    with WorkerProcess(spec, "cpu", 2 * 2**30, threads=2) as worker:
        measured = worker.trial(micro_batch, optimizer_steps=2)["peak_bytes"]
    assert abs(row.peak_bytes - measured) <= 0.03 * measured, (preset, micro_batch, row.peak_bytes, measured)


@pytest.mark.heavy
@pytest.mark.slow
def test_a_7b_model_is_estimated_without_allocating_it(tmp_path):
    model_dir = tmp_path / "llama-7b"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_7B_CONFIG))
    script = f"""
import json, resource
from gaplan.errors import DoesNotFit
from gaplan.estimate import estimate
from gaplan.workload import WorkloadSpec
spec = WorkloadSpec(model={str(model_dir)!r}, seq_len=128)
out = {{}}
try:
    estimate(spec, target="h100-80gb")
except DoesNotFit as exc:
    out["h100_needed"] = exc.needed_bytes
result = estimate(spec, target="h200", effective_batch=64, max_micro_batch=2)
out.update(edge=result.max_micro_batch, capped=result.capped, params=result.param_count,
           accum=result.plan["grad_accum_steps"], peak=result.peak_bytes, usable=result.usable_bytes,
           maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print(json.dumps(out))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert 6.7e9 < out["params"] < 6.8e9
    # fp32 weights + gradients + AdamW states (16 bytes a parameter) and foreach temporaries: not on 80 GB.
    assert out["h100_needed"] > 16 * out["params"] > lookup_target("h100-80gb").total_bytes
    assert out["edge"] == 2 and out["capped"] and out["accum"] == 32
    assert out["peak"] <= out["usable"]
    assert out["maxrss"] < 3 * 2**30  # the weights alone would be 27 GB
