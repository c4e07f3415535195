// The KV cache's element types: the compute dtype, or int8 with a float32 scale per token and KV head
// (engine/kv_cache.py).  The attention kernels are templates over both.
#pragma once

#include <torch/extension.h>

#include <optional>

namespace kvchat {

constexpr int64_t kBlock = 16;  // tokens per cache block, the only size the attention kernels are built for

// Where one KV head's part of a cache block starts: keys (head_dim, 16) and values (16, head_dim) alike
// hold head_dim * 16 elements.  `p`: an attention kernel's problem, with kv_heads and head_dim.
template <typename C, typename Problem>
inline const C* head_block(const C* cache, const Problem& p, int64_t block, int64_t kv_head) {
  return cache + (block * p.kv_heads + kv_head) * p.head_dim * kBlock;
}

// One layer's part of the cache (engine/kv_cache.py): keys, then values, each (blocks, kv_heads, head_dim *
// block_size); an int8 cache's scales likewise, each (blocks, kv_heads, block_size).
template <typename C>
struct LayerKv {
  C* data;
  float* scales;  // an int8 cache's, else nullptr
  int64_t blocks, kv_heads, head_dim, block_size;
};

// Calls fn(T{}, C{}): T is the compute type (the queries'), C the cache's elements, T or int8_t.
template <typename Fn>
void dispatch_kv(at::ScalarType compute, const torch::Tensor& cache, const char* name, Fn fn) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, compute, "dispatch_kv", [&] {
    if (cache.scalar_type() == at::kChar) {
      fn(scalar_t{}, int8_t{});
    } else {
      TORCH_CHECK(cache.scalar_type() == compute, name, ": the cache must be int8 or of the compute dtype");
      fn(scalar_t{}, scalar_t{});
    }
  });
}

// M(T, C) for each pair of compute type and cache element the decode pass (decode_layers_cpu.cpp) runs:
// float and bf16 over a cache of their own dtype or int8; the kernels' raw forms are instantiated for these.
#define KVCHAT_FOR_DECODE_KV_PAIRS(M) \
  M(float, float) M(float, int8_t) M(c10::BFloat16, c10::BFloat16) M(c10::BFloat16, int8_t)

// The scales of an int8 cache (blocks, kv_heads, block_size), checked against it, or nullptr for a float one.
inline const float* kv_scales(const torch::Tensor& cache, const std::optional<torch::Tensor>& scales) {
  const bool int8 = cache.scalar_type() == at::kChar;
  TORCH_CHECK(int8 == scales.has_value(), "an int8 cache needs its scales, a float cache has none");
  if (!int8) return nullptr;
  TORCH_CHECK(scales->scalar_type() == at::kFloat && scales->is_contiguous() && scales->dim() == 3 &&
                  scales->size(0) == cache.size(0) && scales->size(1) == cache.size(1),
              "scales: contiguous float32 (blocks, kv_heads, block_size)");
  return scales->data_ptr<float>();
}

}  // namespace kvchat
