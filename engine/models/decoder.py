"""The Llama family decoder: Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k RMSNorm per head).

Every token of a step goes through the layers as one flat batch of rows; only attention looks at which
sequence a row belongs to, through AttentionMetadata.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.huge_pages import move_to_huge_pages
from engine.layers.attention import AttentionMetadata, LayerCache, paged_attention
from engine.layers.linear import Linear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding


@dataclass
class ModelShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, config) -> "ModelShape":
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=config.model_type == "qwen2" or getattr(config, "attention_bias", False),
            o_bias=config.model_type == "llama" and getattr(config, "attention_bias", False),
            qk_norm=config.model_type == "qwen3",
            tie_word_embeddings=getattr(config, "tie_word_embeddings", False),
        )


class Attention(nn.Module):
    kernels = None  # our C++ decode attention, where the device and shapes allow it

    def __init__(self, shape: ModelShape, rotary: RotaryEmbedding):
        super().__init__()
        self.shape = shape
        self.q_size = shape.num_heads * shape.head_dim
        self.kv_size = shape.num_kv_heads * shape.head_dim
        self.qkv_proj = Linear(shape.hidden_size, self.q_size + 2 * self.kv_size, bias=shape.qkv_bias)
        self.o_proj = Linear(self.q_size, shape.hidden_size, bias=shape.o_bias)
        if shape.qk_norm:
            self.q_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps)
            self.k_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps)
        self.rotary = rotary

    def forward(self, positions, x, kv_cache: LayerCache, meta: AttentionMetadata):
        q, k, v = self.qkv_proj(x, meta.kernel_rows).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.shape.num_heads, self.shape.head_dim)
        k = k.view(-1, self.shape.num_kv_heads, self.shape.head_dim)
        v = v.view(-1, self.shape.num_kv_heads, self.shape.head_dim)
        if self.shape.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        out = paged_attention(q, k, v, kv_cache, meta, self.kernels)
        return self.o_proj(out.flatten(1), meta.kernel_rows)


class MLP(nn.Module):
    kernels = None  # our C++ silu(gate) * up, where the kernels are set

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.gate_up_proj = Linear(shape.hidden_size, 2 * shape.intermediate_size, bias=False)
        self.down_proj = Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x, kernel_rows: int):
        gate_up = self.gate_up_proj(x, kernel_rows)
        if self.kernels is not None:
            return self.down_proj(self.kernels.silu_and_mul(gate_up), kernel_rows)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up, kernel_rows)


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = Attention(shape, rotary)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)

    def forward(self, positions, x, residual, kv_cache, meta):
        """This layer's output and the residual stream before it is added (the next norm adds it)."""
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x, meta.kernel_rows), residual


class CausalLM(nn.Module):
    decode_layers = None  # our C++ pass through every layer for decode steps, where the kernels fit

    def __init__(self, config, max_len: int):
        super().__init__()
        self.shape = shape = ModelShape.from_hf_config(config)
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.rotary = rotary = RotaryEmbedding(config, shape.head_dim, max_len)
        self.layers = nn.ModuleList(DecoderLayer(shape, rotary) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def quantize_int8_(self) -> None:
        """Weight-only int8 for every linear layer, lm_head included (a tied one gets an int8 copy); the
        embeddings stay in the compute dtype: a lookup reads one row per token (README, INT8)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.quantize_int8_()

    def weight_bytes(self) -> int:
        """Bytes of every parameter held (a tied lm_head counted once, a released weight not at all), int8
        scales and packed copies."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        extras = [t for m in linears for t in (m.weight_scale, m.packed, m.onednn) if t is not None]
        return sum(t.nbytes for t in [*self.parameters(), *extras] if not t.is_meta)

    def forward(self, input_ids, positions, kv_cache, kv_scales, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states (tokens, hidden) after the final norm.  kv_cache: (layers, 2, blocks, kv_heads,
        block_size * head_dim); kv_scales: an int8 cache's (layers, 2, blocks, kv_heads, block_size) or
        None."""
        x = self.embed_tokens(input_ids)
        residual = torch.zeros_like(x)
        if self.decode_layers is not None and not meta.prefills:
            x, residual = self.decode_in_one_call(positions, x, residual, kv_cache, kv_scales, meta)
        else:
            layer_scales = kv_scales if kv_scales is not None else [None] * len(self.layers)
            for layer, cache, scales in zip(self.layers, kv_cache, layer_scales, strict=True):
                layer_cache = LayerCache(cache, scales, self.shape.head_dim)
                x, residual = layer(positions, x, residual, layer_cache, meta)
        return self.norm(x, residual)[0]

    def decode_in_one_call(self, positions, x, residual, kv_cache, kv_scales, meta: AttentionMetadata):
        x, residual, received = self.decode_layers.forward(
            x,
            residual,
            positions,
            kv_cache,
            kv_scales,
            meta.decode_block_tables,
            meta.decode_context_lens,
            meta.slot_blocks,
            meta.slot_offsets,
            meta.kernel_rows,
            sum_attention=meta.importance is not None,
        )
        if meta.importance is not None:
            meta.importance.add_decode(received)
        return x, residual

    def use_kernels(self, kernels, attention: bool) -> None:
        """Our C++ CPU kernels for linear layers, norms and rotary and, if `attention`, for attention and
        for decode steps' whole pass through the layers."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.use_kernels(kernels, self.embed_tokens.weight.dtype)
            elif isinstance(module, RMSNorm | RotaryEmbedding | MLP):
                module.kernels = kernels
            elif isinstance(module, Attention):
                module.kernels = kernels if attention else None
        self.move_weights_to_huge_pages()  # the packed copies, now that they are made
        self.decode_layers = self.kernel_decode_layers(kernels) if kernels is not None and attention else None

    def move_weights_to_huge_pages(self) -> None:
        """The weights decode steps stream through, into one area on huge pages (engine/huge_pages.py):
        each linear layer's packed copy, or its plain weight where the products read that one."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        packed = [m for m in linears if m.packed is not None]
        plain = {id(m.weight): m.weight for m in linears if m.packed is None and not m.weight.is_meta}
        copies = move_to_huge_pages([m.packed for m in packed] + [p.detach() for p in plain.values()])
        for module, copy in zip(packed, copies[: len(packed)], strict=True):
            module.packed = copy
        moved = {
            key: nn.Parameter(copy, requires_grad=False)
            for key, copy in zip(plain, copies[len(packed) :], strict=True)
        }
        for module in self.modules():  # a tied lm_head and the embeddings keep sharing one tensor
            for name, param in list(module.named_parameters(recurse=False)):
                if id(param) in moved:
                    setattr(module, name, moved[id(param)])

    def kernel_decode_layers(self, kernels):
        shape = self.shape

        def weights(layer: DecoderLayer):
            attention, mlp = layer.self_attn, layer.mlp
            return kernels.LayerWeights(
                input_norm=layer.input_layernorm.weight,
                post_norm=layer.post_attention_layernorm.weight,
                qkv=attention.qkv_proj.kernel_weights(),
                o=attention.o_proj.kernel_weights(),
                gate_up=mlp.gate_up_proj.kernel_weights(),
                down=mlp.down_proj.kernel_weights(),
                q_norm=attention.q_norm.weight if shape.qk_norm else None,
                k_norm=attention.k_norm.weight if shape.qk_norm else None,
            )

        return kernels.DecodeLayers(
            [weights(layer) for layer in self.layers],
            shape.num_heads,
            shape.num_kv_heads,
            shape.head_dim,
            shape.rms_norm_eps,
            self.rotary.cos,
            self.rotary.sin,
            self.layers[0].mlp.down_proj.max_kernel_rows,  # set above; the same for every layer
        )

    def rows_per_weight_pass(self) -> int | None:
        """Rows a step holds for about the cost of one, where every product reads a packed weight: one
        pass of the products over the weights serves them; None where that is not known."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        if not linears or any(m.packed is None for m in linears):
            return None
        return min(m.kernels.packed_linear_rows_per_pass(m.in_features) for m in linears)

    def logits(self, hidden: torch.Tensor, kernel_rows: int | None = None) -> torch.Tensor:
        """In the compute dtype, as transformers rounds them before widening: a greedy row's argmax needs no
        float32 copy (one of 49,152 logits cost a batch-1 step 75 us), the sampler widens the others."""
        return self.lm_head(hidden, kernel_rows)
