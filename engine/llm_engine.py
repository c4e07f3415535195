"""The engine loop: add requests, step (schedule, run, postprocess), report what changed."""

import ctypes
import hashlib
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig

from engine.block_manager import BlockManager
from engine.config import EngineConfig, resolve_device, resolve_dtype, resolve_kv_dtype
from engine.detokenizer import Detokenizer
from engine.kv_cache import KvCache
from engine.model_files import weight_files
from engine.model_runner import ModelRunner
from engine.models.decoder import ModelShape
from engine.models.loader import load_hf_config, load_model
from engine.protocol import EngineStats
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.session_kv import SessionCache

Prompt = str | list[int] | dict
COUNTERS = (
    "prompt_tokens",
    "prefill_tokens",
    "generation_tokens",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
)


@dataclass
class StepUpdate:
    seq: Sequence
    new_token_ids: list[int]
    new_text: str
    finished: bool


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        hf_config = load_hf_config(config.model)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.max_model_len = min(
            config.max_model_len or hf_config.max_position_embeddings, hf_config.max_position_embeddings
        )
        self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        self.eos_token_ids = eos_token_ids(config.model, self.tokenizer)
        model = load_model(
            config.model, hf_config, self.dtype, self.device, self.max_model_len, config.quantization
        )
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype)
        num_blocks = config.num_kv_blocks or kv_blocks_for_memory(config, model.shape, self.kv_dtype)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        kv_cache = KvCache(model.shape, num_blocks, config.block_size, self.kv_dtype, self.device)
        self.runner = ModelRunner(model, kv_cache)
        give_back_freed_heap()
        self.session_kv = SessionCache(self.block_manager, kv_cache)
        self.scheduler = Scheduler(
            config, self.block_manager, self.session_kv, self.max_model_len, model.rows_per_weight_pass()
        )
        self.fingerprint = model_fingerprint(config.model, self.dtype, config.quantization)
        self.memory_figures = {
            "dtype": str(self.dtype).removeprefix("torch."),
            "quantization": config.quantization or "none",
            "kv_cache_dtype": str(self.kv_dtype).removeprefix("torch."),
            "weight_bytes": model.weight_bytes(),
            "kv_pool_bytes": kv_cache.nbytes,
            "kv_pool_tokens": num_blocks * config.block_size,
            "speculative": config.speculative or "none",
        }
        self.sequences: dict[str, Sequence] = {}
        self.detokenizers: dict[str, Detokenizer] = {}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.recent_ttft: deque[float] = deque(maxlen=1000)
        self.recent_itl: deque[float] = deque(maxlen=5000)

    def add_request(
        self, request_id: str, prompt: Prompt, params: SamplingParams, session_id: str | None = None
    ) -> Sequence:
        if request_id in self.sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        params.validate()
        text, token_ids = self.tokenize(prompt)
        self.check_fits(token_ids, params)
        seq = Sequence(request_id, token_ids, params, prompt=text, session_id=session_id)
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        self.sequences[request_id] = seq
        self.detokenizers[request_id] = Detokenizer(self.tokenizer, token_ids, params)
        self.scheduler.add(seq)
        self.counters["prompt_tokens"] += len(token_ids)
        return seq

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs 'prompt_token_ids'")
            prompt = list(prompt["prompt_token_ids"])
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=False)
        if not all(isinstance(token, int) and 0 <= token < len(self.tokenizer) for token in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {len(self.tokenizer)})")
        return None, list(prompt)

    def check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError("prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but the model's context is {self.max_model_len} "
                "tokens, including at least one new token"
            )
        longest = min(len(token_ids) + params.max_tokens, self.max_model_len)
        capacity = self.block_manager.num_blocks * self.block_manager.block_size
        if self.block_manager.blocks_needed(longest) > self.block_manager.num_blocks:
            raise ValueError(
                f"request needs up to {longest} tokens of KV cache but the pool holds {capacity}; "
                "lower max_tokens or give the engine more KV memory"
            )

    def abort_request(self, request_id: str) -> Sequence:
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            raise ValueError(f"unknown request id {request_id!r}")
        self.detokenizers.pop(request_id)
        self.finish(seq, "abort")
        return seq

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[StepUpdate]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        emitted = self.runner.run(batch)
        now = time.monotonic()
        updates = []
        for item in batch:
            seq = item.seq
            if not seq.output_token_ids:
                self.counters["prefill_tokens"] += item.num_new_tokens
            seq.num_computed_tokens += item.num_new_tokens
            if item.draft_token_ids:
                self.record_draft(seq, len(item.draft_token_ids), len(emitted[seq]) - 1)
            if seq in emitted:
                updates.append(self.postprocess(seq, emitted[seq], now))
            else:
                self.block_manager.cache_full_blocks(seq)
        return updates

    def postprocess(self, seq: Sequence, tokens: list[int], now: float) -> StepUpdate:
        """Append the step's tokens up to the first that stops the request (a draft's included)."""
        detokenizer = self.detokenizers[seq.request_id]
        taken, reason = [], None
        for token in tokens:
            seq.append_token(token)
            taken.append(token)
            reason = self.stop_reason(seq, token, detokenizer.add(token))
            if reason:
                break
        self.record_timing(seq, now, len(taken))
        # Every token but the newest has its KV now: accepted drafts were computed with this step.
        seq.num_computed_tokens = seq.num_tokens - 1
        self.block_manager.cache_full_blocks(seq)
        if reason:
            self.finish(seq, reason)
            del self.sequences[seq.request_id], self.detokenizers[seq.request_id]
        return StepUpdate(seq, taken, detokenizer.take_new_text(reason is not None), reason is not None)

    def record_draft(self, seq: Sequence, drafted: int, accepted: int) -> None:
        seq.draft.record(drafted, accepted)
        self.counters["spec_drafts"] += 1
        self.counters["spec_draft_tokens"] += drafted
        self.counters["spec_accepted_tokens"] += accepted

    def finish(self, seq: Sequence, reason: str) -> None:
        session = self.session_kv.retain(seq) if seq.session_id is not None else None
        self.scheduler.finish(seq, reason)
        if session is not None:
            self.session_kv.finished_turn(session)

    def stop_reason(self, seq: Sequence, token: int, stop_string_seen: bool) -> str | None:
        params = seq.params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop"
        if stop_string_seen:
            return "stop"
        if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def record_timing(self, seq: Sequence, now: float, num_tokens: int) -> None:
        """One inter-token gap per step, however many tokens it emitted (as vLLM records them)."""
        self.counters["generation_tokens"] += num_tokens
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.recent_ttft.append(now - seq.arrival_time)
        else:
            self.recent_itl.append(now - seq.last_token_time)
        seq.last_token_time = now

    def stats(self) -> EngineStats:
        manager = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_total=manager.num_blocks,
            kv_blocks_used=manager.num_blocks - manager.num_free_blocks,
            prefix_cache_queries=manager.prefix_queries,
            prefix_cache_hits=manager.prefix_hits,
            prompt_tokens_total=self.counters["prompt_tokens"],
            prefill_tokens_total=self.counters["prefill_tokens"],
            session_reused_tokens=self.session_kv.reused_tokens,
            generation_tokens_total=self.counters["generation_tokens"],
            num_preemptions=self.scheduler.num_preemptions,
            spec_num_drafts=self.counters["spec_drafts"],
            spec_draft_tokens=self.counters["spec_draft_tokens"],
            spec_accepted_tokens=self.counters["spec_accepted_tokens"],
            ttft_seconds=list(self.recent_ttft),
            itl_seconds=list(self.recent_itl),
            **self.memory_figures,
        )


def eos_token_ids(model_dir, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        configured = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        configured = None
    if configured is not None:
        ids |= set(configured) if isinstance(configured, list) else {configured}
    return ids


def give_back_freed_heap() -> None:
    """Loading frees the checkpoint's float copies and, where packed copies serve every product, the plain
    weights; glibc keeps freed heap memory for reuse until asked to return it (SmolLM2 int8 on the AVX-512
    BF16 kind: 836 MB resident after loading, 698 MB after this)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)


def model_fingerprint(model_dir, dtype: torch.dtype, quantization: str | None = None) -> str:
    """Identifies the weights, their quantization and the dtype that KV was computed with, so saved KV is
    never mixed up."""
    # Unquantized weights keep the fingerprint that session files saved before quantization existed carry.
    digest = hashlib.sha256(f"{dtype} {quantization}".encode() if quantization else str(dtype).encode())
    folder = Path(model_dir)
    digest.update((folder / "config.json").read_bytes())
    for file in weight_files(folder):
        with file.open("rb") as weights:
            digest.update(str(file.stat().st_size).encode())
            digest.update(weights.read(1 << 20))  # the header and the first tensors
    return digest.hexdigest()[:32]


def kv_blocks_for_memory(config: EngineConfig, shape: ModelShape, dtype: torch.dtype) -> int:
    per_block = KvCache.bytes_per_block(shape, config.block_size, dtype)
    return max(1, int(config.kv_cache_memory_gb * 2**30) // per_block)
