import sys

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import cpu_has_amx, cpu_has_avx512, cpu_has_bf16_units
from engine.quantization import int8_linear, quantize_int8


def max_kernel_rows(
    dtype: torch.dtype, quantized: bool = False, packed: bool = False, amx_tiles: bool = False
) -> int:
    """Up to how many rows our kernels beat torch's matrix product.  Without bf16 units (a 2-core AVX2
    machine) the few-row kernel won up to 64 rows over all of SmolLM2's layers (64 rows: 174 ms against
    256 ms).  Where the CPU has them, torch's products run on oneDNN's bf16 dot products and win from a
    few rows: for the 30 layers' products on a 2-core AVX-512 BF16 machine, 8 rows took 6.6 ms against
    the few-row kernel's 9.9 in bf16 and 32 rows 12 ms against 39.  In float32 there, oneDNN with the weight
    reordered once (Linear.onednn) wins from 8 rows: SmolLM2's 121 products, lm_head included, took 26.4 ms
    at 8 rows against the few-row kernel's 28.5 and torch's 55.4, 52.7 at 32 rows against 74.0 and 90.3, and
    at 4 rows the same as the few-row kernel (21.9 and 21.1), which wins at 1 row (16.3 against 25.5).
    With int8 weights torch's product first widens them (~8 ms a step for SmolLM2), so ours wins up to 16
    rows there (14 ms against 18; at 32 rows 46 against 26).

    Packed bf16 weights (packed_linear) beat torch at every size on AVX-512 BF16 units.  Where the CPU
    also has AMX tiles, packed_linear runs on them (amx_tiles) and beats oneDNN (with its weights reordered
    once, Linear.onednn) at every size too: on a 2-core Sapphire Rapids class Xeon, the 30 layers took
    11.0 ms against 19.0 at 32 rows, 19.2 against 24.9 at 96, 66 against 80 at 512 and 150 against 156 at
    1,024.  Its vector path does not: 8.4 ms against 5.9 at 8 rows and 500 against 57 at 512, so layers
    whose inputs the tiles cannot take (not a multiple of 32) keep it for up to 4 rows there.

    Packed int8 weights (widened to bf16 in the kernel, on CPUs with AVX-512 BF16 and no AMX) beat both
    the few-row kernel and torch's product from two rows: the 30 layers on the 2-core AVX-512 BF16
    machine took 7.1 ms at 8 rows against 18 and 36, 23.1 at 32 against 62 and 60, 295 at 512 against
    torch's 400, within 2-4 % of packed bf16 (22.2 and 286).  At one row, with one 16-column panel per
    work item, they beat the few-row kernel too (3.7-3.9 ms against 3.9-4.2), so they serve every size."""
    if packed:
        return sys.maxsize if amx_tiles or not cpu_has_amx() else 4
    if not cpu_has_bf16_units():
        return 64
    if quantized:
        return 16
    return 4 if dtype == torch.bfloat16 else 8


class Linear(nn.Linear):
    """nn.Linear that sends its products to our C++ kernels where they are set.

    bf16 weights on a CPU with AVX-512 BF16 units are packed once for their pair dot products
    (kernels/packed_linear_cpu.cpp), and products go there (max_kernel_rows): on a 2-core AVX-512 BF16
    machine, SmolLM2's 30 layers took the same time from 1 to 8 rows (5.4-6.8 ms, where the few-row kernel
    jumps from 5.6 ms at 3 rows to 13 ms at 4) and beat torch's product up to a prefill chunk (32 rows 12.5
    ms against 17.1; 512 rows 116 against 126).  The plain weight is then released: the weights are held
    once (a tied lm_head keeps the embeddings' rows and a packed copy of them).
    Where the CPU also has AMX tiles, packed_linear runs on them: a product costs about one read of the
    weights up to dozens of rows and beats oneDNN at any size.  On either unit every row's sums depend on
    that row alone, and every product of a layer goes there, so a token's numbers never depend on what
    shares its step: a reply is the same alone or under load, in any prefill chunking, with speculation
    on or off.  A layer the tiles cannot take (inputs not a multiple of 32) sends products of more than a
    few rows to oneDNN, with the weight reordered once into its blocked layout, as vLLM's CPU build does,
    instead of torch's product, which reorders it on every call.
    int8 weights are packed the same way where the CPU has AVX-512 BF16 and no AMX, widened to bf16 as
    they are read, and every product goes there, so int8 replies are batch-invariant too.
    Elsewhere, a decode step's few rows go to the few-row kernel, bound by reading the weights, which
    torch's general product reads at about half the bandwidth for one row and slower for two to eight
    (kernels/few_rows_linear_cpu.cpp); more rows go to torch (max_kernel_rows), or in float32 on AVX-512
    to oneDNN with the weight reordered once, as vLLM's CPU build does: a 32-row step's lm_head took
    24.7 ms in torch's product there against oneDNN's 9.8, a 512-row chunk's up-projection 4.8 ms against
    4.1 (the plain weight stays for the few-row kernel, so float32 weights are held twice).
    """

    kernels = None
    max_kernel_rows = 0  # set with the kernels, for the model's dtype
    packed: torch.Tensor | None = None  # the weight in packed_linear's layout, where the CPU runs it
    onednn: torch.Tensor | None = None  # the weight in oneDNN's blocked layout (AMX; float32 on AVX-512)
    # With int8 weights (quantize_int8_), the float32 scale per output channel.  A plain attribute, not a
    # buffer: the model's .to(dtype) would round a buffer to bf16.
    weight_scale: torch.Tensor | None = None

    def quantize_int8_(self) -> None:
        q, self.weight_scale = quantize_int8(self.weight.detach())
        self.weight = nn.Parameter(q, requires_grad=False)

    def use_kernels(self, kernels, dtype: torch.dtype) -> None:
        """dtype: the model's compute dtype (an int8 layer's weight does not say it).  Where the packed copy
        then serves products of every size, the plain weight is released (a meta tensor keeps its shape and
        dtype), so the weights are held once; such a layer cannot be given other kernels."""
        if self.weight.is_meta:
            raise RuntimeError("the plain weight was released to the packed copy; load the model again")
        self.kernels = kernels
        self.packed = self.onednn = None
        amx_tiles = False
        quantized = self.weight_scale is not None
        if kernels is not None and dtype == torch.bfloat16:
            if not quantized:
                amx_tiles = self.pack_bf16(kernels)
            elif not cpu_has_amx():
                # int8 takes the vector path only, which AMX machines run slowly for many rows (above).
                self.packed = self.packed_weight(kernels)
        elif kernels is not None and dtype == torch.float32 and not quantized and cpu_has_avx512():
            self.onednn = self.onednn_weight()
        self.max_kernel_rows = max_kernel_rows(dtype, quantized, self.packed is not None, amx_tiles)
        if self.max_kernel_rows == sys.maxsize:
            self.weight = nn.Parameter(self.weight.detach().to("meta"), requires_grad=False)

    def pack_bf16(self, kernels) -> bool:
        """Packs the weight where our kernels take it, else reorders it for oneDNN on AMX machines.
        Returns whether products run on AMX tiles."""
        self.packed = self.packed_weight(kernels)
        if self.packed is not None and kernels.packed_linear_on_amx(self.in_features):
            return True
        if cpu_has_amx():
            self.onednn = self.onednn_weight()
        return False

    def onednn_weight(self) -> torch.Tensor | None:
        """The weight reordered once into oneDNN's blocked layout, where torch has oneDNN."""
        if not torch.backends.mkldnn.is_available():
            return None
        return torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())

    def packed_weight(self, kernels) -> torch.Tensor | None:
        """The weight in packed_linear's layout, where the CPU runs it and the shape fits."""
        if self.out_features % 32 or self.in_features % 4 or not kernels.packed_linear_available():
            return None
        return kernels.pack_weight(self.weight.detach())

    def kernel_weights(self):
        """This layer's weights as our C++ decode pass takes them."""
        return self.kernels.LinearWeights(self.weight, self.packed, self.onednn, self.bias, self.weight_scale)

    def forward(self, x: torch.Tensor, kernel_rows: int | None = None) -> torch.Tensor:
        """kernel_rows: the rows that choose the kernel, where x has more (AttentionMetadata.kernel_rows)."""
        rows = x.shape[0] if kernel_rows is None else kernel_rows
        if self.kernels is not None and rows <= self.max_kernel_rows:
            if self.packed is not None:
                return self.kernels.packed_linear(x, self.packed, self.bias, self.weight_scale)
            return self.kernels.few_rows_linear(x, self.weight, self.bias, self.weight_scale)
        if self.onednn is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.onednn, self.bias, "none", [], None)
        slow_bf16 = x.dtype == torch.bfloat16 and x.device.type == "cpu" and not cpu_has_bf16_units()
        if self.weight_scale is not None:
            product_input = x.float() if slow_bf16 else x
            return int8_linear(product_input, self.weight, self.weight_scale, self.bias).to(x.dtype)
        if slow_bf16:
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
