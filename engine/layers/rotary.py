import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Scalings whose frequencies depend only on the config; dynamic ones change with the sequence length.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to max_len, looked up by each token's position."""

    kernels = None  # our C++ CPU kernels, where set: rotates q and k in place in one call

    def __init__(self, config, head_dim: int, max_len: int):
        super().__init__()
        self.config, self.head_dim, self.max_len = config, head_dim, max_len
        cos, sin = self.tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        # Built on the CPU in float32 exactly as transformers builds them, then moved.
        inv_freq, scaling = self.inverse_frequencies()
        positions = torch.arange(self.max_len, dtype=torch.float32, device="cpu")
        angles = torch.cat([positions[:, None] * inv_freq[None, :]] * 2, dim=-1)
        return angles.cos() * scaling, angles.sin() * scaling

    def inverse_frequencies(self) -> tuple[torch.Tensor, float]:
        rope = self.config.rope_parameters
        if rope["rope_type"] == "default":
            exponents = (
                torch.arange(0, self.head_dim, 2, dtype=torch.int64, device="cpu").float() / self.head_dim
            )
            return 1.0 / (rope["rope_theta"] ** exponents), 1.0
        return ROPE_INIT_FUNCTIONS[rope["rope_type"]](self.config, device=torch.device("cpu"))

    def reset(self) -> None:
        """Refill the tables, e.g. after the module was materialised from the meta device."""
        cos, sin = self.tables()
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # q: (tokens, heads, head_dim), k: (tokens, kv_heads, head_dim)
        if self.kernels is not None:
            self.kernels.rotary(q, k, positions, self.cos, self.sin)
            return q, k
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
