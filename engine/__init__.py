"""kvchat's inference engine: paged KV cache, continuous batching, chunked prefill, prefix caching."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.model_files import ModelLoadError
from engine.outputs import CompletionOutput, RequestOutput, StreamDelta
from engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "ModelLoadError",
    "RequestOutput",
    "SamplingParams",
    "StreamDelta",
]
