"""The paged KV cache's tensors, and reading and writing any of its slots: the model runner attends over
them, and session KV reads and writes slots to compress, save and restore a session.

With `--kv-cache-dtype int8` keys and values are stored in 8 bits with a float32 scale per token and KV
head (engine/quantization.py), quantized as they are written; the attention kernels read them as they
are.  Slots are read and written in their stored form, so compressing, saving and restoring a session
never rounds its KV a second time.
"""

import math
from dataclasses import dataclass

import torch

from engine.huge_pages import zeros_on_huge_pages
from engine.models.decoder import ModelShape


@dataclass
class SlotsKv:
    """Some slots' KV as stored: keys and values (layers, slots, kv_heads, head_dim); for an int8 cache
    their scales (layers, keys/values, slots, kv_heads); the attention each slot received."""

    keys: torch.Tensor
    values: torch.Tensor
    scales: torch.Tensor | None
    importance: torch.Tensor

    def cpu(self) -> "SlotsKv":
        """A copy on the CPU, independent of the pool."""

        def copy(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return tensor.cpu().clone() if tensor is not None else None

        return SlotsKv(copy(self.keys), copy(self.values), copy(self.scales), copy(self.importance))


def pool_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The pool's tensor; on the CPU on huge pages (engine/huge_pages.py), where a decode step's attention
    reads each block of a layer from its own 4 KiB page otherwise: SmolLM2's batch-1 decode at 3,000 tokens
    of context ran 1.04x as fast so (1.02x at 1,000, 1.01x at 142; bf16, two engines interleaved in one
    process, 2-core AVX2 kind)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return zeros_on_huge_pages(math.prod(shape) * dtype.itemsize).view(dtype).view(shape)


class KvCache:
    def __init__(self, shape: ModelShape, blocks: int, block_size: int, dtype: torch.dtype, device):
        """`dtype`: the compute dtype, or torch.int8 for the 8-bit cache."""
        self.block_size = block_size
        layers, kv_heads = shape.num_layers, shape.num_kv_heads
        # (layers, keys/values, blocks, kv_heads, block_size * head_dim); see layers/attention.py.
        width = block_size * shape.head_dim
        self.tensor = pool_zeros((layers, 2, blocks, kv_heads, width), dtype, torch.device(device))
        self.scales = None  # int8: (layers, keys/values, blocks, kv_heads, block_size) float32
        if dtype == torch.int8:
            self.scales = torch.zeros(layers, 2, blocks, kv_heads, block_size, device=device)
        self.importance = torch.zeros(blocks * block_size, device=device)  # attention each slot received

    @staticmethod
    def bytes_per_block(shape: ModelShape, block_size: int, dtype: torch.dtype) -> int:
        per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype.itemsize
        if dtype == torch.int8:
            per_token += 2 * shape.num_layers * shape.num_kv_heads * torch.float32.itemsize
        return per_token * block_size

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes + (self.scales.nbytes if self.scales is not None else 0)

    def slot_ids(self, block_ids: list[int], count: int) -> torch.Tensor:
        """The first `count` slots of a block table."""
        blocks = torch.tensor(block_ids, dtype=torch.long).repeat_interleave(self.block_size)
        offsets = torch.arange(self.block_size).repeat(len(block_ids))
        return (blocks * self.block_size + offsets)[:count].to(self.tensor.device)

    @torch.inference_mode()
    def read_slots(self, slots: torch.Tensor) -> SlotsKv:
        keys, values = self.views()
        blocks, offsets = slots // self.block_size, slots % self.block_size
        k = keys[:, blocks, :, :, offsets].transpose(0, 1)
        v = values[:, blocks, :, offsets, :].transpose(0, 1)
        scales = None
        if self.scales is not None:
            scales = self.scales[:, :, blocks, :, offsets].permute(1, 2, 0, 3)
        return SlotsKv(k, v, scales, self.importance[slots])

    @torch.inference_mode()
    def write_slots(self, slots: torch.Tensor, kv: SlotsKv) -> None:
        if (kv.scales is None) != (self.scales is None) or kv.keys.dtype != self.tensor.dtype:
            raise ValueError(f"KV stored as {kv.keys.dtype} cannot go into a {self.tensor.dtype} cache")
        keys, values = self.views()
        blocks, offsets = slots // self.block_size, slots % self.block_size
        device = self.tensor.device
        keys[:, blocks, :, :, offsets] = kv.keys.transpose(0, 1).to(device)
        values[:, blocks, :, offsets, :] = kv.values.transpose(0, 1).to(device)
        if self.scales is not None:
            self.scales[:, :, blocks, :, offsets] = kv.scales.permute(2, 0, 1, 3).to(device)
        self.importance[slots] = kv.importance.to(self.importance)

    def views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys as (layers, blocks, kv_heads, head_dim, block_size), values (layers, blocks, kv_heads,
        block_size, head_dim): the layouts the attention kernels read."""
        layers, _, blocks, kv_heads, width = self.tensor.shape
        head_dim = width // self.block_size
        keys = self.tensor[:, 0].view(layers, blocks, kv_heads, head_dim, self.block_size)
        values = self.tensor[:, 1].view(layers, blocks, kv_heads, self.block_size, head_dim)
        return keys, values
