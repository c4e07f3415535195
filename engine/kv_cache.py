"""The paged KV cache's tensors, and reading and writing any of its slots: the model runner attends over
them, and session KV reads and writes slots to compress, save and restore a session."""

import torch

from engine.models.decoder import ModelShape


class KvCache:
    def __init__(self, shape: ModelShape, blocks: int, block_size: int, dtype: torch.dtype, device):
        self.block_size = block_size
        # (layers, keys/values, blocks, kv_heads, block_size * head_dim); see layers/attention.py.
        self.tensor = torch.zeros(
            shape.num_layers,
            2,
            blocks,
            shape.num_kv_heads,
            block_size * shape.head_dim,
            dtype=dtype,
            device=device,
        )
        self.importance = torch.zeros(blocks * block_size, device=device)  # attention each slot received

    @staticmethod
    def bytes_per_block(shape: ModelShape, block_size: int, dtype: torch.dtype) -> int:
        per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim
        return per_token * block_size * dtype.itemsize

    def slot_ids(self, block_ids: list[int], count: int) -> torch.Tensor:
        """The first `count` slots of a block table."""
        blocks = torch.tensor(block_ids, dtype=torch.long).repeat_interleave(self.block_size)
        offsets = torch.arange(self.block_size).repeat(len(block_ids))
        return (blocks * self.block_size + offsets)[:count].to(self.tensor.device)

    @torch.inference_mode()
    def read_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(keys, values) as (layers, slots, kv_heads, head_dim), then the slots' importance."""
        keys, values = self.views()
        blocks, offsets = slots // self.block_size, slots % self.block_size
        k = keys[:, blocks, :, :, offsets].transpose(0, 1)
        v = values[:, blocks, :, offsets, :].transpose(0, 1)
        return k, v, self.importance[slots]

    @torch.inference_mode()
    def write_slots(self, slots: torch.Tensor, k, v, importance) -> None:
        keys, values = self.views()
        blocks, offsets = slots // self.block_size, slots % self.block_size
        keys[:, blocks, :, :, offsets] = k.transpose(0, 1).to(self.tensor)
        values[:, blocks, :, offsets, :] = v.transpose(0, 1).to(self.tensor)
        self.importance[slots] = importance.to(self.importance)

    def views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys as (layers, blocks, kv_heads, head_dim, block_size), values (layers, blocks, kv_heads,
        block_size, head_dim): the layouts the attention kernels read."""
        layers, _, blocks, kv_heads, width = self.tensor.shape
        head_dim = width // self.block_size
        keys = self.tensor[:, 0].view(layers, blocks, kv_heads, head_dim, self.block_size)
        values = self.tensor[:, 1].view(layers, blocks, kv_heads, self.block_size, head_dim)
        return keys, values
