"""Weight-only INT8: symmetric, one scale per output channel, made at load time from the model's own
weights (no calibration data).  Activations stay in the compute dtype; a product is (x @ q.T) * scale,
which equals x @ (q * scale).T up to rounding.

On a CPU a decode step with few rows is bound by reading the weights, so half the bytes of bf16 is up to
twice the tokens per second for a single chat (engine/kernels/few_rows_linear_cpu.cpp reads the int8 rows
and widens them in registers).
"""

import torch
import torch.nn.functional as F

QUANTIZATIONS = ("int8",)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): q int8 (out, in) in [-127, 127], scale float32 (out,), with weight ~= q * scale[:, None].
    The largest magnitude of each row maps to 127, so no value clips; an all-zero row gets scale 1."""
    weight = weight.float()
    largest = weight.abs().amax(dim=1)
    scale = torch.where(largest > 0, largest / 127, torch.ones_like(largest))
    q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weights an int8 layer computes with: what a reference implementation should load."""
    return q.float() * scale[:, None]


def int8_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ (q * scale).T + bias through torch's product in x's dtype: int8 values are exact in bf16 and
    float16, so only the product rounds; the scale and bias are applied in float32.  The portable path (any
    device) and the many-row path on the CPU; decode_layers_cpu.cpp does the same, op for op."""
    out = F.linear(x, q.to(x.dtype)) * scale
    if bias is not None:
        out = out + bias
    return out.to(x.dtype)
