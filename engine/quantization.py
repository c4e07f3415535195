"""INT8, symmetric, one scale per row: weight-only INT8 with a scale per output channel, made at load time
from the model's own weights (no calibration data), and the 8-bit KV cache with a scale per token and KV
head (engine/kv_cache.py).  Activations stay in the compute dtype; a product is (x @ q.T) * scale,
which equals x @ (q * scale).T up to rounding.

On a CPU a decode step with few rows is bound by reading the weights, so half the bytes of bf16 is up to
twice the tokens per second for a single chat (engine/kernels/few_rows_linear_cpu.cpp reads the int8 rows
and widens them in registers; on AVX2 CPUs it multiplies them with bf16 or float16 x in integers, x held
in int16 with a power-of-two scale per block, rounding only values 2^8 below their block's largest);
steps of more rows widen packed int8 weights to bf16 a cache-sized piece at a time for the CPU's bf16
units (engine/kernels/packed_linear_cpu.cpp).
"""

import torch
import torch.nn.functional as F

QUANTIZATIONS = ("int8",)
KV_CACHE_DTYPES = ("auto", "int8")  # auto: the compute dtype (vLLM's name for the setting)


def quantize_int8(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): q int8 (..., n) in [-127, 127], scale float32 (...), with rows ~= q * scale[..., None].
    The largest magnitude of each row maps to 127, so no value clips; an all-zero row gets scale 1.
    write_kv in kernels/layer_ops_cpu.cpp quantizes KV with the same float32 operations."""
    rows = rows.float()
    largest = rows.abs().amax(dim=-1)
    scale = torch.where(largest > 0, largest / 127, torch.ones_like(largest))
    q = torch.round(rows / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 rows an int8 layer or KV cache computes with: what a reference implementation loads."""
    return q.float() * scale[..., None]


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
