"""Comparing fp32 results computed in a different order (accumulated vs one batch, other ranks, other loops).

Elementwise absolute tolerances fail on some CPUs: an AVX-512 Xeon sums in another order than an
AMD EPYC, and a gradient element near zero then differs by ~1e-6 of the gradient's scale while
its own value is tiny. The tolerance here is relative to the tensor's scale (its largest
magnitude), which is what fp32 reduction order moves, on every x86 CPU.
"""

import torch

FP32_RTOL = 1e-5  # fp32 has ~7 digits; reductions over thousands of terms lose one or two


def assert_close_at_scale(actual: torch.Tensor, expected: torch.Tensor, rtol: float = FP32_RTOL, msg: str = "") -> None:
    """Every element within ``rtol`` of the expected tensor's largest magnitude (and ``rtol`` of itself)."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale, msg=msg or None)


def relative_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|: the number the comparison tables report."""
    return float((actual - expected).abs().max() / expected.abs().max())
