import torch
import torch.nn.functional as F
from torch import nn

from engine.config import cpu_has_bf16_units

# Up to this many rows our kernel beat torch's matrix product over all of SmolLM2's layers on our 2-core
# AVX2 machine (64 rows: 174 ms against 256 ms); at 128 rows they tie.
MAX_KERNEL_ROWS = 64


class Linear(nn.Linear):
    """nn.Linear that sends the few rows of a decode step to our C++ kernel where one is set.

    A decode step's linear layers are bound by reading their weights; torch's general matrix product
    reads them at about half the CPU's memory bandwidth for one row and slower for two to eight
    (kernels/few_rows_linear_cpu.cpp).  Prefill chunks, with more rows, go to torch.
    """

    kernels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.shape[0] <= MAX_KERNEL_ROWS:
            return self.kernels.few_rows_linear(x, self.weight, self.bias)
        if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not cpu_has_bf16_units():
            return widened_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def widened_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A bf16 product computed in float32, for CPUs without bf16 matrix units (AVX-512 BF16, AMX).

    There torch's bf16 product is 7x slower than float32 (512 rows by 576 -> 3,072: 107 ms against
    15 ms), and widening both operands first costs about a millisecond.  Products accumulate in float32
    either way; the result is rounded to bf16 as torch's would be.
    """
    widened_bias = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), widened_bias).to(x.dtype)
