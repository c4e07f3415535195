// The small per-layer operations of a decode step, one call each instead of a dozen torch ops.
//
// At batch 1 a SmolLM2 step runs some 2,000 torch ops; each costs microseconds of dispatch whatever its
// size, which adds up to a third of the step.  RMSNorm (with the residual add before it), rotary
// embedding and the KV-cache write are the bulk of them.  Each follows transformers' formula in float32,
// so greedy tokens stay those of transformers (tests/engine/test_greedy_equals_transformers.py).
#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>

#include "kernels.h"
#include "kv_types.h"
#include "simd.h"

namespace kvchat {
namespace {

template <typename T>
void normalise_row(const T* row, const T* weight, T* out, int64_t size, double eps) {
  vfloat squares = {};
  int64_t i = 0;
  for (; i + kLanes <= size; i += kLanes) {
    const vfloat v = load_lanes(row + i);
    squares += v * v;
  }
  float sum = horizontal_sum(squares);
  for (; i < size; ++i) sum += static_cast<float>(row[i]) * static_cast<float>(row[i]);
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(size) + static_cast<float>(eps));
  // transformers: weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), each product rounded to the dtype.
  for (int64_t j = 0; j < size; ++j) {
    const T normalised = static_cast<T>(static_cast<float>(row[j]) * scale);
    out[j] = static_cast<T>(static_cast<float>(weight[j]) * static_cast<float>(normalised));
  }
}

// One token's key or value head into the cache, `stride` apart; into an int8 cache quantized as
// engine/quantization.py's quantize_int8 does, in the same float32 operations, with its scale to *scale.
template <typename T, typename C>
void store_row(const T* row, int64_t size, C* target, int64_t stride, float* scale) {
  if constexpr (std::is_same_v<C, int8_t>) {
    float largest = 0;
    for (int64_t d = 0; d < size; ++d) largest = std::max(largest, std::abs(static_cast<float>(row[d])));
    *scale = largest > 0 ? largest / 127.0f : 1.0f;
    for (int64_t d = 0; d < size; ++d) {
      const float q = std::nearbyint(static_cast<float>(row[d]) / *scale);  // ties to even, as torch.round
      target[d * stride] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
  } else {
    for (int64_t d = 0; d < size; ++d) target[d * stride] = row[d];
  }
}

// out[0:width] = silu(gate) * up as torch computes it: gate / (1 + e^-gate) in float32, and in bf16 each
// of the two results rounded to bf16, as two torch ops round them.  Past e^88, where exp_wide's exponent
// bits end, e^-gate is taken as infinite and the quotient as -0 (torch's is below 1e-36 up to e^88.7).
template <typename T>
void activate_row(const T* gate, const T* up, T* out, int64_t width) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  int64_t i = 0;
  for (; i + kWideLanes <= width; i += kWideLanes) {
    const vwide g = load_wide(gate + i), bound = splat_wide(88.0f);
    const vwide minus_g = -g;
    const vwide e = minus_g < bound ? exp_wide(minus_g) : splat_wide(INFINITY);
    vwide silu = g / (1.0f + e);
    if constexpr (kBf16) silu = round_to_bf16(silu);
    store_wide(out + i, silu * load_wide(up + i));
  }
  for (; i < width; ++i) {
    const float g = static_cast<float>(gate[i]);
    const T silu = static_cast<T>(g / (1.0f + std::exp(-g)));
    out[i] = static_cast<T>(static_cast<float>(silu) * static_cast<float>(up[i]));
  }
}

// Rows of a prefill are split between the threads; a decode step's few rows stay on one, where a parallel
// region would cost more than the rows.
void for_rows(int64_t rows, const std::function<void(int64_t)>& body) {
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) body(r);
  });
}

void check_rows(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous (rows, hidden) tensor");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "weight must be (hidden,) of x's dtype");
}

}  // namespace

template <typename T>
void add_rms_norm_rows(T* x, T* residual, const T* weight, int64_t rows, int64_t size, double eps) {
  for_rows(rows, [&](int64_t r) {
    for (int64_t j = 0; j < size; ++j) residual[r * size + j] += x[r * size + j];
    normalise_row(residual + r * size, weight, x + r * size, size, eps);
  });
}

template <typename T>
void rms_norm_heads(T* x, int64_t rows, int64_t heads, int64_t stride, const T* weight, int64_t head_dim,
                    double eps) {
  for_rows(rows, [&](int64_t r) {
    for (int64_t h = 0; h < heads; ++h) {
      T* head = x + r * stride + h * head_dim;
      normalise_row(head, weight, head, head_dim, eps);  // reads each value before it writes it
    }
  });
}

template <typename T>
void silu_and_mul_rows(const T* x, int64_t rows, int64_t stride, int64_t width, T* out) {
  for_rows(rows, [&](int64_t r) { activate_row(x + r * stride, x + r * stride + width, out + r * width, width); });
}

template <typename T>
void rotary_rows(T* x, int64_t rows, int64_t heads, int64_t stride, const int64_t* positions, const T* cos,
                 const T* sin, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for_rows(rows, [&](int64_t t) {
    const T* c = cos + positions[t] * head_dim;
    const T* s = sin + positions[t] * head_dim;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + t * stride + h * head_dim;
      // transformers: x * cos + rotate_half(x) * sin, where rotate_half(x) = (-second half, first half).
      for (int64_t d = 0; d < half; ++d) {
        const float first = static_cast<float>(v[d]), second = static_cast<float>(v[d + half]);
        v[d] = static_cast<T>(first * static_cast<float>(c[d]) - second * static_cast<float>(s[d]));
        v[d + half] =
            static_cast<T>(second * static_cast<float>(c[d + half]) + first * static_cast<float>(s[d + half]));
      }
    }
  });
}

template <typename T, typename C>
void write_kv_rows(const T* k, const T* v, int64_t tokens, int64_t k_stride, int64_t v_stride,
                   const int64_t* slot_blocks, const int64_t* slot_offsets, const LayerKv<C>& cache) {
  const int64_t kv_heads = cache.kv_heads, head_dim = cache.head_dim, block_size = cache.block_size;
  const int64_t width = head_dim * block_size;
  const int64_t values_at = cache.blocks * kv_heads * width, value_scales_at = cache.blocks * kv_heads * block_size;
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t block = slot_blocks[i], offset = slot_offsets[i];
    TORCH_CHECK(block >= 0 && block < cache.blocks && offset >= 0 && offset < block_size, "slot out of range");
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t cell = (block * kv_heads + h) * width;  // keys transposed: (head_dim, block_size)
      float* scale = cache.scales != nullptr ? cache.scales + (block * kv_heads + h) * block_size + offset : nullptr;
      store_row(k + i * k_stride + h * head_dim, head_dim, cache.data + cell + offset, block_size, scale);
      store_row(v + i * v_stride + h * head_dim, head_dim, cache.data + values_at + cell + offset * head_dim, 1,
                scale != nullptr ? scale + value_scales_at : nullptr);
    }
  }
}

template void add_rms_norm_rows(float*, float*, const float*, int64_t, int64_t, double);
template void add_rms_norm_rows(c10::BFloat16*, c10::BFloat16*, const c10::BFloat16*, int64_t, int64_t, double);
template void rms_norm_heads(float*, int64_t, int64_t, int64_t, const float*, int64_t, double);
template void rms_norm_heads(c10::BFloat16*, int64_t, int64_t, int64_t, const c10::BFloat16*, int64_t, double);
template void silu_and_mul_rows(const float*, int64_t, int64_t, int64_t, float*);
template void silu_and_mul_rows(const c10::BFloat16*, int64_t, int64_t, int64_t, c10::BFloat16*);
template void rotary_rows(float*, int64_t, int64_t, int64_t, const int64_t*, const float*, const float*, int64_t);
template void rotary_rows(c10::BFloat16*, int64_t, int64_t, int64_t, const int64_t*, const c10::BFloat16*,
                          const c10::BFloat16*, int64_t);
#define KVCHAT_WRITE_KV_ROWS(T, C)                                                                         \
  template void write_kv_rows(const T*, const T*, int64_t, int64_t, int64_t, const int64_t*, const int64_t*, \
                              const LayerKv<C>&);
KVCHAT_FOR_DECODE_KV_PAIRS(KVCHAT_WRITE_KV_ROWS)

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  x = x.contiguous();
  check_rows(x, weight);
  auto out = torch::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const int64_t size = x.size(1);
    for_rows(x.size(0), [&](int64_t r) {
      normalise_row(x.data_ptr<scalar_t>() + r * size, weight.data_ptr<scalar_t>(),
                    out.data_ptr<scalar_t>() + r * size, size, eps);
    });
  });
  return out;
}

void add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps) {
  check_rows(x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.is_contiguous() && residual.scalar_type() == x.scalar_type(),
              "residual must be contiguous, shaped and typed as x");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    add_rms_norm_rows(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), x.size(0),
                      x.size(1), eps);
  });
}

torch::Tensor silu_and_mul(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0 && x.stride(1) == 1, "x must be (rows, 2 * width), rows contiguous");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16, "x: float32 or bf16");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  auto out = torch::empty({rows, width}, x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.scalar_type() == torch::kFloat)
    silu_and_mul_rows(x.data_ptr<float>(), rows, x.stride(0), width, out.data_ptr<float>());
  else
    silu_and_mul_rows(x.data_ptr<c10::BFloat16>(), rows, x.stride(0), width, out.data_ptr<c10::BFloat16>());
  return out;
}

void rotary(torch::Tensor q, torch::Tensor k, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin) {
  for (const torch::Tensor* x : {&q, &k})
    TORCH_CHECK(x->dim() == 3 && x->stride(2) == 1 && x->stride(1) == x->size(2) && x->size(0) == positions.numel(),
                "q and k must be (tokens, heads, head_dim) with each token's heads contiguous");
  TORCH_CHECK(cos.scalar_type() == q.scalar_type() && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.size(1) == q.size(2) && sin.sizes() == cos.sizes(),
              "cos and sin must be contiguous (positions, head_dim) tables of q's dtype");
  TORCH_CHECK(positions.scalar_type() == torch::kLong && positions.is_contiguous(), "positions: int64");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "rotary", [&] {
    for (torch::Tensor* x : {&q, &k})
      rotary_rows(x->data_ptr<scalar_t>(), x->size(0), x->size(1), x->stride(0), positions.data_ptr<int64_t>(),
                  cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), x->size(2));
  });
}

void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor layer_cache, torch::Tensor slot_blocks,
              torch::Tensor slot_offsets, std::optional<torch::Tensor> layer_scales) {
  TORCH_CHECK(layer_cache.is_contiguous() && layer_cache.dim() == 4, "layer_cache: (2, blocks, kv_heads, width)");
  TORCH_CHECK(k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type(), "k and v: one shape and dtype");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k.stride(1) == k.size(2) && v.stride(1) == v.size(2),
              "k and v: (tokens, kv_heads, head_dim) with each token's heads contiguous");
  TORCH_CHECK(k.size(1) == layer_cache.size(2) && layer_cache.size(3) % k.size(2) == 0,
              "k and v must match the cache's kv_heads and head_dim");
  TORCH_CHECK(slot_blocks.is_contiguous() && slot_offsets.is_contiguous() &&
                  slot_blocks.scalar_type() == torch::kLong && slot_offsets.scalar_type() == torch::kLong &&
                  slot_blocks.numel() == k.size(0) && slot_offsets.numel() == k.size(0),
              "slot_blocks and slot_offsets: contiguous int64, one per token");
  const int64_t blocks = layer_cache.size(1), block_size = layer_cache.size(3) / k.size(2);
  if (layer_scales.has_value())
    TORCH_CHECK(layer_scales->scalar_type() == torch::kFloat && layer_scales->is_contiguous() &&
                    layer_scales->numel() == 2 * blocks * k.size(1) * block_size,
                "layer_scales: contiguous float32 (2, blocks, kv_heads, block_size)");
  dispatch_kv(k.scalar_type(), layer_cache, "write_kv", [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    TORCH_CHECK((std::is_same_v<C, int8_t>) == layer_scales.has_value(), "an int8 cache needs its scales");
    const LayerKv<C> cache{layer_cache.data_ptr<C>(), layer_scales ? layer_scales->data_ptr<float>() : nullptr,
                           blocks, k.size(1), k.size(2), block_size};
    write_kv_rows(k.data_ptr<T>(), v.data_ptr<T>(), k.size(0), k.stride(0), v.stride(0),
                  slot_blocks.data_ptr<int64_t>(), slot_offsets.data_ptr<int64_t>(), cache);
  });
}

}  // namespace kvchat
