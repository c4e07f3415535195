"""Engine configuration, validated once; `resolve_*` turn "auto" into what this machine supports."""

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.quantization import KV_CACHE_DTYPES, QUANTIZATIONS
from engine.speculative import MAX_SPECULATIVE_TOKENS, SPECULATIVE_METHODS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
POLICIES = ("fcfs", "short_first")


@dataclass
class EngineConfig:
    model: str | Path
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None  # default: the model's max positions
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 2.0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    quantization: str | None = None  # "int8": weight-only, one scale per output channel (vLLM's name)
    kv_cache_dtype: str = "auto"  # "int8": keys and values in 8 bits, a scale per token and KV head
    speculative: str | None = None  # "ngram": drafts by prompt lookup (engine/speculative.py)
    # Most draft tokens per sequence and step (vLLM's names from here); 6 by measurement (README).
    num_speculative_tokens: int = 6
    prompt_lookup_min: int = 2  # shortest n-gram a draft is looked up by
    prompt_lookup_max: int = 4  # longest

    def __post_init__(self):
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {self.scheduling_policy!r}")
        if self.speculative is not None and self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative must be one of {SPECULATIVE_METHODS}, got {self.speculative!r}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "n-gram sizes need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )
        drafts = self.num_speculative_tokens
        if not 1 <= drafts <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {drafts}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory_gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_kv_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the KV cache stores: the compute dtype, or int8."""
    return torch.int8 if name == "int8" else dtype


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA and on CPUs with bf16 units.

    Elsewhere float32: our kernels make bf16 fast there too (batch-1 decode 1.3-1.5x float32's, prefill
    as fast), but in bf16 SmolLM2-135M answered the API tests' "What is the capital of France?" under the
    server's system prompt with "L'Etoile, la Marseillaise," instead of Paris, so bf16 stays a choice.
    """
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_bf16_units() else torch.float32


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (avx2, avx512_bf16, amx_bf16, ...); none where /proc/cpuinfo is missing."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return frozenset()
    flags = next((line.split(":", 1)[1] for line in lines if line.startswith("flags")), "")
    return frozenset(flags.split())


def cpu_has_bf16_units() -> bool:
    """Without AVX-512 BF16 or AMX, bf16 matrix products run far slower than float32 on the CPU."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_has_avx512() -> bool:
    """AVX-512, on which oneDNN's float32 products beat torch's own (layers/linear.py)."""
    return "avx512f" in cpu_flags()


def cpu_has_amx() -> bool:
    """AMX tiles, on which oneDNN's bf16 products and torch's CPU flash attention beat our AVX-512 BF16
    kernels for all but a few rows (layers/linear.py, layers/attention.py)."""
    return "amx_bf16" in cpu_flags()
