// Decode attention straight from the paged KV cache, for the CPU.
//
// The torch path gathers every sequence's blocks into a padded copy before attending; at decode time
// that copy costs more than the attention itself.  These two kernels read keys and values in place,
// through the block tables, and leave the softmax between them to torch.
//
// A block holds its keys transposed, (kv_heads, head_dim, 16 tokens), so q.k runs along the block's
// tokens in vector lanes with no horizontal sums, and its values as (kv_heads, 16 tokens, head_dim), so
// p.v runs along head_dim.  The query heads sharing a KV head (GROUP) are a compile-time constant so
// their accumulators stay in registers.
//
// An int8 cache is read as it is, widened in registers: a block's 16 key scales multiply its 16 q.k
// sums, and each value's scale multiplies its probability, so no float copy of the cache is made.
//
// q (seqs, heads, head_dim); block_tables (seqs, max_blocks) int64; context_lens (seqs,) int64;
// scores / probs (seqs, heads, max_context) float32; out (seqs, heads, head_dim); scales (blocks,
// kv_heads, 16) float32 for an int8 cache.
#include <ATen/Parallel.h>

#include "kernels.h"
#include "kv_types.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int64_t kBlock = 16;  // tokens per block the kernels are built for
constexpr int64_t kVectors = kBlock / kLanes;
constexpr int64_t kDimChunk = 32;  // head_dim elements one p.v pass accumulates in registers
// A float cache's scales: multiplying by 1 is exact, so one code path serves both kinds of cache.
constexpr float kOnes[kBlock] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

// The 16 scales of one block and KV head.
inline const float* block_scales(const float* scales, int64_t block, int64_t kv_heads, int64_t kv_head) {
  return scales != nullptr ? scales + (block * kv_heads + kv_head) * kBlock : kOnes;
}

inline void store_lanes(float* target, const vfloat (&block)[kVectors], int64_t count) {
  float values[kBlock];
  std::memcpy(values, block, sizeof(values));
  std::copy_n(values, count, target);
}

struct Shape {
  int64_t seqs, heads, head_dim, kv_heads, max_context, max_blocks;
};

template <typename T, typename C, int GROUP>
void qk(const Shape s, const T* q, const C* k_cache, const float* k_scales, const int64_t* tables,
        const int64_t* lens, float scale, float* scores) {
  at::parallel_for(0, s.seqs * s.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(GROUP * s.head_dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / s.kv_heads, kv_head = item % s.kv_heads;
      const T* q_row = q + (seq * s.heads + kv_head * GROUP) * s.head_dim;
      for (int64_t i = 0; i < GROUP * s.head_dim; ++i) query[i] = static_cast<float>(q_row[i]) * scale;
      float* out = scores + (seq * s.heads + kv_head * GROUP) * s.max_context;
      for (int64_t first = 0, b = 0; first < lens[seq]; first += kBlock, ++b) {
        const int64_t block = tables[seq * s.max_blocks + b];
        const C* keys = k_cache + (block * s.kv_heads + kv_head) * s.head_dim * kBlock;
        const float* key_scales = block_scales(k_scales, block, s.kv_heads, kv_head);
        vfloat acc[GROUP][kVectors] = {};
        for (int64_t d = 0; d < s.head_dim; ++d) {
          vfloat row[kVectors];
          for (int v = 0; v < kVectors; ++v) row[v] = load_lanes(keys + d * kBlock + v * kLanes);
          for (int g = 0; g < GROUP; ++g) {
            const float x = query[g * s.head_dim + d];
            for (int v = 0; v < kVectors; ++v) acc[g][v] += x * row[v];
          }
        }
        for (int v = 0; v < kVectors; ++v) {
          const vfloat key_scale = load_lanes(key_scales + v * kLanes);
          for (int g = 0; g < GROUP; ++g) acc[g][v] *= key_scale;
        }
        const int64_t count = std::min(kBlock, lens[seq] - first);
        for (int g = 0; g < GROUP; ++g) store_lanes(out + g * s.max_context + first, acc[g], count);
      }
    }
  });
}

template <typename T, typename C, int GROUP>
void pv(const Shape s, const float* probs, const C* v_cache, const float* v_scales, const int64_t* tables,
        const int64_t* lens, T* out) {
  at::parallel_for(0, s.seqs * s.kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / s.kv_heads, kv_head = item % s.kv_heads;
      const float* p = probs + (seq * s.heads + kv_head * GROUP) * s.max_context;
      T* o = out + (seq * s.heads + kv_head * GROUP) * s.head_dim;
      for (int64_t d0 = 0; d0 < s.head_dim; d0 += kDimChunk) {
        constexpr int kChunkVectors = kDimChunk / kLanes;
        vfloat acc[GROUP][kChunkVectors] = {};
        for (int64_t first = 0, b = 0; first < lens[seq]; first += kBlock, ++b) {
          const int64_t block = tables[seq * s.max_blocks + b];
          const C* values = v_cache + (block * s.kv_heads + kv_head) * kBlock * s.head_dim + d0;
          const float* value_scales = block_scales(v_scales, block, s.kv_heads, kv_head);
          const int64_t count = std::min(kBlock, lens[seq] - first);
          for (int64_t t = 0; t < count; ++t) {
            vfloat row[kChunkVectors];
            for (int v = 0; v < kChunkVectors; ++v) row[v] = load_lanes(values + t * s.head_dim + v * kLanes);
            for (int g = 0; g < GROUP; ++g) {
              const float weight = p[g * s.max_context + first + t] * value_scales[t];
              for (int v = 0; v < kChunkVectors; ++v) acc[g][v] += weight * row[v];
            }
          }
        }
        for (int g = 0; g < GROUP; ++g) {
          float values[kDimChunk];
          std::memcpy(values, acc[g], sizeof(values));
          for (int64_t d = 0; d < kDimChunk; ++d) o[g * s.head_dim + d0 + d] = static_cast<T>(values[d]);
        }
      }
    }
  });
}

Shape shape_of(const torch::Tensor& q_or_out, int64_t kv_heads, int64_t max_context,
               const torch::Tensor& block_tables) {
  return {q_or_out.size(0), q_or_out.size(1), q_or_out.size(2), kv_heads, max_context, block_tables.size(1)};
}

void check(const torch::Tensor& cache, const torch::Tensor& block_tables, const torch::Tensor& context_lens,
           int64_t heads) {
  TORCH_CHECK(cache.is_contiguous() && cache.dim() == 4, "cache must be a contiguous 4-d tensor");
  TORCH_CHECK(cache.size(2) == kBlock || cache.size(3) == kBlock, "the kernels need blocks of 16 tokens");
  TORCH_CHECK(block_tables.scalar_type() == torch::kLong && block_tables.is_contiguous(), "block_tables: int64");
  TORCH_CHECK(context_lens.scalar_type() == torch::kLong && context_lens.is_contiguous(), "context_lens: int64");
  TORCH_CHECK((cache.size(2) * cache.size(3)) % (kBlock * kDimChunk) == 0, "head_dim must be a multiple of 32");
  TORCH_CHECK(heads % cache.size(1) == 0 && heads / cache.size(1) <= 8, "1 to 8 query heads per KV head");
}

}  // namespace

torch::Tensor paged_qk(torch::Tensor q, torch::Tensor k_cache, torch::Tensor block_tables,
                       torch::Tensor context_lens, int64_t max_context, double scale,
                       std::optional<torch::Tensor> k_scales) {
  check(k_cache, block_tables, context_lens, q.size(1));
  const float* scales = kv_scales(k_cache, k_scales);
  q = q.contiguous();
  auto scores = torch::full({q.size(0), q.size(1), max_context}, -INFINITY, q.options().dtype(torch::kFloat));
  const Shape s = shape_of(q, k_cache.size(1), max_context, block_tables);
  dispatch_kv(q.scalar_type(), k_cache, "paged_qk", [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    with_constant<8>(s.heads / s.kv_heads, [&](auto group) {
      qk<T, C, decltype(group)::value>(s, q.data_ptr<T>(), k_cache.data_ptr<C>(), scales,
                                       block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(),
                                       static_cast<float>(scale), scores.data_ptr<float>());
    });
  });
  return scores;
}

torch::Tensor paged_pv(torch::Tensor probs, torch::Tensor v_cache, torch::Tensor block_tables,
                       torch::Tensor context_lens, std::optional<torch::Tensor> v_scales, at::ScalarType dtype) {
  check(v_cache, block_tables, context_lens, probs.size(1));
  const float* scales = kv_scales(v_cache, v_scales);
  probs = probs.contiguous();
  auto out = torch::empty({probs.size(0), probs.size(1), v_cache.size(3)}, v_cache.options().dtype(dtype));
  const Shape s = shape_of(out, v_cache.size(1), probs.size(2), block_tables);
  dispatch_kv(dtype, v_cache, "paged_pv", [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    with_constant<8>(s.heads / s.kv_heads, [&](auto group) {
      pv<T, C, decltype(group)::value>(s, probs.data_ptr<float>(), v_cache.data_ptr<C>(), scales,
                                       block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(),
                                       out.data_ptr<T>());
    });
  });
  return out;
}

}  // namespace kvchat
