"""The cost model of a lever row: a time per optimizer step from its split, its recompute and its optimizer. No torch.

An optimizer step of ``E`` samples in ``S`` micro-steps costs, at a device's nominal rates (:data:`RATES`):

* compute, ``E x 2 P T x (1 + (1 + t) + r_b (1 - h) + r_h h)`` FLOPs over the FLOP rate: the forward is 2 FLOPs
  a weight a token (``P`` weights, ``T`` tokens a sample; Kaplan et al. 2020, "Scaling Laws for Neural Language
  Models", sec. 2.1: C_forward ~ 2N, training ~ 6N); the backward is one forward for the inputs' gradients and
  one more for the weights' own, made only for the trained fraction ``t`` (1 in full training, the adapters'
  share with LoRA). Recompute is one more forward of what is recomputed (Chen et al. 2016, "Training Deep Nets
  with Sublinear Memory Cost": one extra forward; Korthikanti et al. 2022 measure full checkpointing at about
  a third more): the checkpointed fraction ``r_b`` of the blocks' share ``1 - h``, and the LM head's share
  ``h = V H / P`` again for the chunked loss;
* per micro-step, the weights read twice (forward and backward) and the trained weights' gradients read and
  written once (accumulation), over the memory bandwidth: the fixed cost that more accumulation steps pay;
* the optimizer step, :data:`OPTIMIZER_PASSES` full-size passes over the trained weights, over the bandwidth;
* with activation offloading, what the step saves for backward (as the estimate traced it) over the host link twice,
  to the host in forward and back in backward, not overlapped with compute (torch's ``save_on_cpu`` copies on the
  compute stream).

Attention's ``T^2`` term, kernel launches and Python overhead are left out: this ranks rows, it does not
predict seconds (``gaplan plan --measure`` times them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rates:
    """A device's nominal peak compute, memory bandwidth and host link, one way (only their ratios change a
    ranking)."""

    flops_per_s: float
    bytes_per_s: float
    source: str
    host_bytes_per_s: float | None = None  # None: the host is the device's memory (nothing is offloaded)


RATES = {
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s dense BF16 tensor core, 3.35 TB/s HBM3, PCIe Gen5 128 GB/s (both ways
    # together: 64 GB/s each).
    "cuda": Rates(989e12, 3.35e12, "NVIDIA H100 SXM datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s, PCIe Gen5 "
                  "64 GB/s a way", host_bytes_per_s=64e9),
    # Intel Xeon Platinum 8380 (Intel ARK): 40 cores x 2.3 GHz x 32 FP32 FLOP/cycle (two AVX-512 FMA units) = 2.94
    # TFLOP/s; 8 channels of DDR4-3200 = 204.8 GB/s.
    "cpu": Rates(2.94e12, 204.8e9, "Intel Xeon Platinum 8380 (ARK): 2.94 TFLOP/s FP32 AVX-512, 204.8 GB/s DDR4"),
}

# Bytes an optimizer step moves per trained weight, as (full-size passes in the weights' dtype, extra bytes) of a
# single-pass kernel, counted from each update rule: every tensor read once, and written once when it changes.
OPTIMIZER_PASSES = {
    "adamw": (7, 0),  # weight read+write, gradient read, two moments read+write (torch.optim.AdamW)
    "adamw-fused": (7, 0),  # the same single pass (the fused kernel is it)
    "adamw-forloop": (7, 0),  # the same traffic, counted as one pass (its per-parameter launches are not modelled)
    "adamw-8bit": (3, 4),  # weight read+write, gradient read; two uint8 moments read+write (bitsandbytes)
    "paged-adamw-8bit": (3, 4),  # as adamw-8bit; paging to the host under pressure is not modelled
    "adafactor": (5, 8),  # weight read+write, gradient read twice (factored statistics, then the update),
    #                        an fp32 update written and read (transformers' Adafactor.step)
    "lion": (5, 0),  # weight read+write, gradient read, momentum read+write (Chen et al. 2023, Algorithm 2)
    "sgd": (3, 0),  # weight read+write, gradient read (torch.optim.SGD without momentum)
}


@dataclass(frozen=True)
class CostInputs:
    """What the cost model reads of the workload."""

    param_count: int  # every weight (P)
    trainable_count: int  # the weights the optimizer trains
    head_params: int  # the LM head's V x H (0 when the model has none)
    tokens_per_sample: int  # T (for seq2seq: source and target)
    weight_bytes: int  # bytes of one weight (its dtype)
    device_kind: str = "cuda"


@dataclass(frozen=True)
class StepCost:
    """One optimizer step's modelled time, by part (seconds at :data:`RATES`)."""

    compute_s: float
    micro_steps_s: float
    optimizer_s: float
    host_s: float = 0.0  # activation offloading's copies

    @property
    def total_s(self) -> float:
        return self.compute_s + self.micro_steps_s + self.optimizer_s + self.host_s


def step_cost(inputs: CostInputs, *, effective_batch: int, grad_accum_steps: int, optimizer: str,
              recompute_blocks: float = 0.0, recompute_head: float = 0.0, host_bytes: float = 0.0) -> StepCost:
    """The modelled time of one optimizer step of ``effective_batch`` samples in ``grad_accum_steps`` micro-steps
    (``host_bytes``: what the step offloads, sent to the host and back)."""
    if inputs.param_count < 1 or effective_batch < 1 or grad_accum_steps < 1:
        raise ValueError("the cost model needs weights, samples and at least one micro-step")
    rates = RATES[inputs.device_kind]
    head = min(inputs.head_params / inputs.param_count, 1.0)
    trained = min(inputs.trainable_count / inputs.param_count, 1.0)
    forwards = 1 + (1 + trained) + recompute_blocks * (1 - head) + recompute_head * head
    compute = effective_batch * 2 * inputs.param_count * inputs.tokens_per_sample * forwards
    per_micro_step = (2 * inputs.param_count + 2 * inputs.trainable_count) * inputs.weight_bytes
    passes, extra = OPTIMIZER_PASSES[optimizer]
    optimizer_bytes = inputs.trainable_count * (passes * inputs.weight_bytes + extra)
    if host_bytes and rates.host_bytes_per_s is None:
        raise ValueError(f"nothing is offloaded on {inputs.device_kind}: its host is its memory")
    return StepCost(compute_s=compute / rates.flops_per_s,
                    micro_steps_s=grad_accum_steps * per_micro_step / rates.bytes_per_s,
                    optimizer_s=optimizer_bytes / rates.bytes_per_s,
                    host_s=2 * host_bytes / rates.host_bytes_per_s if host_bytes else 0.0)
