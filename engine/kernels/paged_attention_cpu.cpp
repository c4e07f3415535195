// Decode attention straight from the paged KV cache, for the CPU: q.k, softmax and p.v in one pass.
//
// The torch path gathers every sequence's blocks into a padded copy before attending; at decode time
// that copy costs more than the attention itself.  This kernel reads keys and values in place, through
// the block tables.  A work item is one sequence and KV head: its scores for the query heads sharing
// the KV head (GROUP, a compile-time constant so their accumulators stay in registers) go to a
// per-thread buffer that stays in L1, become probabilities there (normalised before p.v, as transformers
// does: dividing the sums afterwards parted an int8-KV session from its oracle at a 0.11 logit margin),
// and multiply the values.  One parallel region per layer, no
// scores tensor, and the next block is prefetched while one is computed: blocks sit anywhere in the
// pool, out of reach of the hardware prefetcher (two kernels and torch's softmax between them took
// three regions and 3-4x this time at 32 sequences of 400 tokens).
//
// A block holds its keys transposed, (kv_heads, head_dim, 16 tokens), so q.k runs along the block's
// tokens in vector lanes with no horizontal sums, and its values as (kv_heads, 16 tokens, head_dim), so
// p.v runs along head_dim.
//
// An int8 cache is read as it is, widened in registers: a block's 16 key scales multiply its 16 q.k
// sums, and each value's scale multiplies its probability, so no float copy of the cache is made.
//
// q (seqs, heads, head_dim); k_cache (blocks, kv_heads, head_dim, 16); v_cache (blocks, kv_heads, 16,
// head_dim); block_tables (seqs, max_blocks) int64; context_lens (seqs,) int64; an int8 cache's scales
// (blocks, kv_heads, 16) float32.  Returns out (seqs, heads, head_dim) and, if asked, the probabilities
// summed over heads, (seqs, max_blocks * 16) float32, 0 past each context.
#include <ATen/Parallel.h>

#include "kernels.h"
#include "kv_types.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int64_t kBlock = 16;  // tokens per block the kernel is built for
constexpr int64_t kVectors = kBlock / kWideLanes;
constexpr int kPassVectors = 4;  // vectors of head_dim one p.v pass over a block accumulates in registers
constexpr int64_t kLine = 64;  // bytes per cache line
// A float cache's scales: multiplying by 1 is exact, so one code path serves both kinds of cache.
constexpr float kOnes[kBlock] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

struct Problem {
  int64_t heads, head_dim, kv_heads, max_blocks, max_context;
  float scale;
  const float *k_scales, *v_scales;  // an int8 cache's, else nullptr
  const int64_t *tables, *lens;
};

// Where one KV head's part of a block starts: keys and values alike hold head_dim * 16 elements.
template <typename C>
inline const C* head_block(const C* cache, const Problem& p, int64_t block, int64_t kv_head) {
  return cache + (block * p.kv_heads + kv_head) * p.head_dim * kBlock;
}

inline const float* block_scales(const float* scales, const Problem& p, int64_t block, int64_t kv_head) {
  return scales != nullptr ? scales + (block * p.kv_heads + kv_head) * kBlock : kOnes;
}

template <typename C>
inline void prefetch(const C* start, int64_t elements) {
  const char* bytes = reinterpret_cast<const char*>(start);
  for (int64_t offset = 0; offset < elements * static_cast<int64_t>(sizeof(C)); offset += kLine)
    __builtin_prefetch(bytes + offset);
}

// scores[g][0:padded] = scale * q_g . each key of the context (past it: whatever the block holds).
template <typename C, int GROUP>
void qk(const Problem& p, const float* query, const C* k_cache, int64_t seq, int64_t kv_head, float* scores,
        int64_t padded) {
  const int64_t* table = p.tables + seq * p.max_blocks;
  const int64_t length = p.lens[seq];
  for (int64_t first = 0, b = 0; first < length; first += kBlock, ++b) {
    const C* keys = head_block(k_cache, p, table[b], kv_head);
    if (first + kBlock < length) prefetch(head_block(k_cache, p, table[b + 1], kv_head), p.head_dim * kBlock);
    // Two chains of FMAs (even and odd d) where one would leave the FMA units waiting on its latency.
    constexpr int CHAINS = GROUP * kVectors >= 8 ? 1 : 2;
    vwide acc[CHAINS][GROUP][kVectors] = {};
    for (int64_t d = 0; d < p.head_dim; d += CHAINS) {
      for (int c = 0; c < CHAINS; ++c) {
        vwide row[kVectors];
        for (int v = 0; v < kVectors; ++v) row[v] = load_wide(keys + (d + c) * kBlock + v * kWideLanes);
        for (int g = 0; g < GROUP; ++g) {
          const float x = query[g * p.head_dim + d + c];
          for (int v = 0; v < kVectors; ++v) acc[c][g][v] += x * row[v];
        }
      }
    }
    if constexpr (CHAINS == 2)
      for (int g = 0; g < GROUP; ++g)
        for (int v = 0; v < kVectors; ++v) acc[0][g][v] += acc[1][g][v];
    const float* key_scales = block_scales(p.k_scales, p, table[b], kv_head);
    for (int v = 0; v < kVectors; ++v) {
      const vwide key_scale = load_wide(key_scales + v * kWideLanes);
      for (int g = 0; g < GROUP; ++g) store(scores + g * padded + first + v * kWideLanes, acc[0][g][v] * key_scale);
    }
  }
}

// sums[g][d0:d0 + VECTORS * kWideLanes] += probabilities[g][first:first + count] . the block's values there.
template <typename C, int GROUP, int VECTORS>
void pv_block(const float* probabilities, int64_t padded, const C* values, const float* value_scales, int64_t first,
              int64_t count, int64_t head_dim, int64_t d0, float* sums) {
  vwide acc[GROUP][VECTORS];
  for (int g = 0; g < GROUP; ++g)
    for (int v = 0; v < VECTORS; ++v) acc[g][v] = load_wide(sums + g * head_dim + d0 + v * kWideLanes);
  for (int64_t t = 0; t < count; ++t) {
    vwide row[VECTORS];
    for (int v = 0; v < VECTORS; ++v) row[v] = load_wide(values + t * head_dim + d0 + v * kWideLanes);
    for (int g = 0; g < GROUP; ++g) {
      const float weight = probabilities[g * padded + first + t] * value_scales[t];
      for (int v = 0; v < VECTORS; ++v) acc[g][v] += weight * row[v];
    }
  }
  for (int g = 0; g < GROUP; ++g)
    for (int v = 0; v < VECTORS; ++v) store(sums + g * head_dim + d0 + v * kWideLanes, acc[g][v]);
}

// sums[g][0:head_dim] = probabilities[g] . values.  Up to kPassVectors vectors of head_dim per
// pass over a block: GROUP * kPassVectors chains of FMAs, enough to hide their latency.
template <typename C, int GROUP>
void pv(const Problem& p, const float* probabilities, int64_t padded, const C* v_cache, int64_t seq, int64_t kv_head,
        float* sums) {
  const int64_t* table = p.tables + seq * p.max_blocks;
  const int64_t length = p.lens[seq];
  std::fill(sums, sums + GROUP * p.head_dim, 0.0f);
  for (int64_t first = 0, b = 0; first < length; first += kBlock, ++b) {
    const C* values = head_block(v_cache, p, table[b], kv_head);
    if (first + kBlock < length) prefetch(head_block(v_cache, p, table[b + 1], kv_head), p.head_dim * kBlock);
    const float* value_scales = block_scales(p.v_scales, p, table[b], kv_head);
    const int64_t count = std::min(kBlock, length - first);
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += kPassVectors * kWideLanes) {
      with_constant<kPassVectors>((p.head_dim - d0) / kWideLanes, [&](auto vectors) {
        pv_block<C, GROUP, decltype(vectors)::value>(probabilities, padded, values, value_scales, first, count,
                                                     p.head_dim, d0, sums);
      });
    }
  }
}

// One sequence and KV head; `received`, if not null, is the sequence's row to add probabilities to.
template <typename T, typename C, int GROUP>
void attend(const Problem& p, const T* q, const C* k_cache, const C* v_cache, int64_t seq, int64_t kv_head,
            std::vector<float>& buffer, T* out, float* received) {
  const int64_t hd = p.head_dim, length = p.lens[seq];
  const int64_t padded = (length + kBlock - 1) / kBlock * kBlock;
  buffer.resize(GROUP * (2 * hd + padded));
  float *query = buffer.data(), *sums = query + GROUP * hd, *scores = sums + GROUP * hd;
  const T* q_rows = q + (seq * p.heads + kv_head * GROUP) * hd;
  for (int64_t i = 0; i < GROUP * hd; ++i) query[i] = static_cast<float>(q_rows[i]) * p.scale;
  qk<C, GROUP>(p, query, k_cache, seq, kv_head, scores, padded);
  for (int g = 0; g < GROUP; ++g) {
    float* s = scores + g * padded;
    const float inverse = 1.0f / softmax_numerators(s, length, padded);
    for (int64_t j = 0; j < length; ++j) s[j] *= inverse;
    if (received != nullptr)
      for (int64_t j = 0; j < length; ++j) received[j] += s[j];
  }
  pv<C, GROUP>(p, scores, padded, v_cache, seq, kv_head, sums);
  T* o = out + (seq * p.heads + kv_head * GROUP) * hd;
  for (int64_t i = 0; i < GROUP * hd; ++i) o[i] = static_cast<T>(sums[i]);
}

template <typename T, typename C, int GROUP>
void attend_all(const Problem& p, int64_t seqs, const T* q, const C* k_cache, const C* v_cache, T* out,
                float* received_parts) {
  at::parallel_for(0, seqs * p.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer;
    for (int64_t item = begin; item < end; ++item) {
      // Each KV head adds to a row of its own, summed over heads afterwards: no two threads share a row.
      float* received = received_parts != nullptr ? received_parts + item * p.max_context : nullptr;
      attend<T, C, GROUP>(p, q, k_cache, v_cache, item / p.kv_heads, item % p.kv_heads, buffer, out, received);
    }
  });
}

void check(const torch::Tensor& k_cache, const torch::Tensor& v_cache, const torch::Tensor& block_tables,
           const torch::Tensor& context_lens, int64_t heads, int64_t head_dim) {
  for (const auto& cache : {k_cache, v_cache})
    TORCH_CHECK(cache.is_contiguous() && cache.dim() == 4 && cache.scalar_type() == k_cache.scalar_type(),
                "caches must be contiguous 4-d tensors of one dtype");
  TORCH_CHECK(k_cache.size(3) == kBlock && v_cache.size(2) == kBlock, "the kernel needs blocks of 16 tokens");
  TORCH_CHECK(k_cache.size(2) == head_dim && head_dim % 16 == 0,
              "head_dim must be a multiple of 16");
  TORCH_CHECK(block_tables.scalar_type() == torch::kLong && block_tables.is_contiguous(), "block_tables: int64");
  TORCH_CHECK(context_lens.scalar_type() == torch::kLong && context_lens.is_contiguous(), "context_lens: int64");
  TORCH_CHECK(heads % k_cache.size(1) == 0 && heads / k_cache.size(1) <= 8, "1 to 8 query heads per KV head");
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> paged_decode_attention(
    torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_tables,
    torch::Tensor context_lens, double scale, std::optional<torch::Tensor> k_scales,
    std::optional<torch::Tensor> v_scales, bool sum_attention) {
  TORCH_CHECK(q.dim() == 3, "q must be (seqs, heads, head_dim)");
  q = q.contiguous();
  const int64_t seqs = q.size(0), heads = q.size(1), kv_heads = k_cache.size(1);
  check(k_cache, v_cache, block_tables, context_lens, heads, q.size(2));
  const int64_t max_context = block_tables.size(1) * kBlock;
  const Problem p{heads,
                  q.size(2),
                  kv_heads,
                  block_tables.size(1),
                  max_context,
                  static_cast<float>(scale),
                  kv_scales(k_cache, k_scales),
                  kv_scales(v_cache, v_scales),
                  block_tables.data_ptr<int64_t>(),
                  context_lens.data_ptr<int64_t>()};
  auto out = torch::empty_like(q);
  torch::Tensor received_parts;
  if (sum_attention) received_parts = torch::zeros({seqs, kv_heads, max_context}, q.options().dtype(torch::kFloat));
  dispatch_kv(q.scalar_type(), k_cache, "paged_decode_attention", [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    with_constant<8>(heads / kv_heads, [&](auto group) {
      attend_all<T, C, decltype(group)::value>(p, seqs, q.data_ptr<T>(), k_cache.data_ptr<C>(),
                                               v_cache.data_ptr<C>(), out.data_ptr<T>(),
                                               sum_attention ? received_parts.data_ptr<float>() : nullptr);
    });
  });
  return {out, sum_attention ? received_parts.sum(1) : torch::Tensor()};
}

}  // namespace kvchat
