import torch
from torch import nn


class RMSNorm(nn.Module):
    """transformers' RMSNorm; given the residual stream too, it adds x to it first (vLLM's fused form)."""

    kernels = None  # our C++ CPU kernels, where set: one call instead of eight torch ops

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """RMSNorm(x); or, with `residual`, (RMSNorm(x + residual), x + residual)."""
        if residual is None:
            return self.normalise(x)
        if self.kernels is not None:
            self.kernels.add_rms_norm(x, residual, self.weight, self.eps)  # in place, both
            return x, residual
        residual = x + residual
        return self.normalise(residual), residual

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.rms_norm(x.reshape(-1, x.shape[-1]), self.weight, self.eps).view_as(x)
        # Computed in float32 whatever the weights' dtype, as transformers does, so greedy tokens agree.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)
