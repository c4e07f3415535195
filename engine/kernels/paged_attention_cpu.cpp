// Decode attention straight from the paged KV cache, for the CPU: q.k, softmax and p.v in one pass.
//
// The torch path gathers every sequence's blocks into a padded copy before attending; at decode time
// that copy costs more than the attention itself.  This kernel reads keys and values in place, through
// the block tables.  A work item is a KV head and up to four rows of one sequence (a step checking a
// draft has a row per draft token, and each block is read once for all of them, not once a row: a
// 4-sequence step with drafts of 6 at 600 tokens took 10.0 ms instead of 10.8 for SmolLM2's 30 layers on
// a 2-core AMX Xeon, little because the rows' arithmetic, not the reads, bounds it there).  Its scores
// for the query heads sharing the KV head (GROUP, a compile-time constant so their accumulators stay in
// registers) go to a per-thread buffer that stays in L1, become probabilities there
// (normalised before p.v, as transformers does: dividing the sums afterwards parted an int8-KV session
// from its oracle at a 0.11 logit margin), and multiply the values.  One parallel region per layer, no
// scores tensor (two kernels and torch's softmax between them took three regions and 3-4x this time at 32
// sequences of 400 tokens).
//
// A block holds its keys transposed, (kv_heads, head_dim, 16 tokens), so q.k runs along the block's
// tokens in vector lanes with no horizontal sums, and its values as (kv_heads, 16 tokens, head_dim), so
// p.v runs along head_dim.
//
// An int8 cache is read as it is, widened in registers: a block's 16 key scales multiply its 16 q.k
// sums, and each value's scale multiplies its probability, so no float copy of the cache is made.
//
// bf16 queries over a bf16 cache run both products on the CPU's bf16 pair dot products, as prefill does
// (attention_bf16.h): the scores are scaled after q.k, and the probabilities rounded to bf16 before
// p.v, as torch's CPU attention rounds them.
//
// q (seqs, heads, head_dim); k_cache (blocks, kv_heads, head_dim, 16); v_cache (blocks, kv_heads, 16,
// head_dim); block_tables (seqs, max_blocks) int64; context_lens (seqs,) int64; an int8 cache's scales
// (blocks, kv_heads, 16) float32.  Returns out (seqs, heads, head_dim) and, if asked, the probabilities
// summed over heads, (seqs, max_blocks * 16) float32, 0 past each context.
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "kernels.h"
#include "kv_types.h"
#include "attention_bf16.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int64_t kVectors = kBlock / kWideLanes;
constexpr int kPassVectors = 4;  // vectors of head_dim one p.v pass over a block accumulates in registers
constexpr int64_t kLine = 64;  // bytes per cache line
constexpr int kChainsBf16 = 2;  // q.k's accumulators a query head with the bf16 products: GROUP is 1-8
// A float cache's scales: multiplying by 1 is exact, so one code path serves both kinds of cache.
constexpr float kOnes[kBlock] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

inline const float* block_scales(const float* scales, const DecodeProblem& p, int64_t block, int64_t kv_head) {
  return scales != nullptr ? scales + (block * p.kv_heads + kv_head) * kBlock : kOnes;
}

// Blocks sit anywhere in the pool, out of reach of the hardware prefetcher, and one block's bf16 arithmetic
// is too short to hide a fetch from memory: a sequence's blocks are fetched into L2 kAheadBlocks ahead of
// the one computed.  Fetching only the next block, into L1, SmolLM2's 30 layers of bf16 decode attention
// took 3.7-3.8 ms at one sequence of 2,048 tokens against 3.1-3.3 now, 7.9-8.0 against 6.8-7.0 at 4,096,
// and 17.7 against 16.2 at 32 sequences of 216-432 (2-core AVX-512 BF16 kind, interleaved in one process;
// 4 to 16 blocks ahead measured alike).  int8 and float32 caches, whose arithmetic bounds them, did not
// change.
constexpr int64_t kAheadBlocks = 8;

template <typename C>
inline void fetch_to_l2(const C* start, int64_t elements) {
  const char* bytes = reinterpret_cast<const char*>(start);
  for (int64_t offset = 0; offset < elements * static_cast<int64_t>(sizeof(C)); offset += kLine)
    __builtin_prefetch(bytes + offset, 0, 2);  // locality 2: prefetcht1, into L2
}

// Before block b of a sequence's `blocks` is computed: the one kAheadBlocks on (at the first, all of those
// up to it).
template <typename C>
inline void fetch_ahead(const C* cache, const DecodeProblem& p, const int64_t* table, int64_t kv_head, int64_t b,
                        int64_t blocks) {
  for (int64_t next = b == 0 ? 1 : kAheadBlocks; next <= kAheadBlocks && b + next < blocks; ++next)
    fetch_to_l2(head_block(cache, p, table[b + next], kv_head), p.head_dim * kBlock);
}

// scores[g][first:first + 16] = scale * q_g . each key of the block (past the context: whatever it holds).
template <typename C, int GROUP>
void qk_block(const DecodeProblem& p, const float* query, const C* keys, const float* key_scales, float* scores,
              int64_t padded, int64_t first) {
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
  for (int v = 0; v < kVectors; ++v) {
    const vwide key_scale = load_wide(key_scales + v * kWideLanes);
    for (int g = 0; g < GROUP; ++g) store(scores + g * padded + first + v * kWideLanes, acc[0][g][v] * key_scale);
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

// One row's part of an item: its scaled query, its p.v sums and its scores (probabilities), in the item's
// buffer.  The rows of an item share its sequence's blocks, each with its own length.
struct Row {
  int64_t index, length;
  float *query, *sums, *scores;
  const c10::BFloat16* bf16_query;     // the bf16 products' query, as it is
  c10::BFloat16* bf16_probabilities;  // the bf16 products' probabilities (GROUP, padded)
};

// Up to kItemRows rows of one sequence (a step checking a draft has a row for its last token and one per
// draft token) and one KV head: each block is read from memory once for all of them, and each row computes
// what it would alone, in the same order, so a drafted step's rows keep the bits of the step without drafts.
constexpr int64_t kItemRows = 4;
struct Item {
  int64_t first_row, rows, kv_head;
};

// Every row's scores over its context, the blocks in order, later ones fetched while one is computed.
template <typename T, typename C, int GROUP>
void qk(const DecodeProblem& p, const C* k_cache, const int64_t* table, int64_t kv_head, Row* rows, int64_t count,
        int64_t padded) {
  const int64_t blocks = padded / kBlock;
  for (int64_t first = 0, b = 0; first < rows[count - 1].length; first += kBlock, ++b) {
    const C* keys = head_block(k_cache, p, table[b], kv_head);
    fetch_ahead(k_cache, p, table, kv_head, b, blocks);
    const float* key_scales = block_scales(p.k_scales, p, table[b], kv_head);
    for (int64_t r = 0; r < count; ++r) {
      if (first >= rows[r].length) continue;
#ifdef __AVX512BF16__
      if constexpr (kDotBf16<T, C>) {
        qk_block_bf16<GROUP, kChainsBf16>(rows[r].bf16_query, p.head_dim, keys, rows[r].scores + first, padded);
        continue;
      }
#endif
      qk_block<C, GROUP>(p, rows[r].query, keys, key_scales, rows[r].scores, padded, first);
    }
  }
}

// Every row's sums[g][0:head_dim] = probabilities[g] . values.  Up to kPassVectors vectors of head_dim per
// pass over a block: GROUP * kPassVectors chains of FMAs, enough to hide their latency.
template <typename C, int GROUP>
void pv(const DecodeProblem& p, const C* v_cache, const int64_t* table, int64_t kv_head, Row* rows, int64_t count,
        int64_t padded) {
  const int64_t blocks = padded / kBlock;
  for (int64_t r = 0; r < count; ++r) std::fill(rows[r].sums, rows[r].sums + GROUP * p.head_dim, 0.0f);
  for (int64_t first = 0, b = 0; first < rows[count - 1].length; first += kBlock, ++b) {
    const C* values = head_block(v_cache, p, table[b], kv_head);
    fetch_ahead(v_cache, p, table, kv_head, b, blocks);
    const float* value_scales = block_scales(p.v_scales, p, table[b], kv_head);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t tokens = std::min(kBlock, rows[r].length - first);
      for (int64_t d0 = 0; tokens > 0 && d0 < p.head_dim; d0 += kPassVectors * kWideLanes) {
        with_constant<kPassVectors>((p.head_dim - d0) / kWideLanes, [&](auto vectors) {
          pv_block<C, GROUP, decltype(vectors)::value>(rows[r].scores, padded, values, value_scales, first, tokens,
                                                       p.head_dim, d0, rows[r].sums);
        });
      }
    }
  }
}

#ifdef __AVX512BF16__
// pv with the bf16 products: 32 elements of head_dim per pass over a span of kAheadBlocks blocks, whose next
// span is fetched while one is computed.
template <int GROUP>
void pv_bf16(const DecodeProblem& p, const c10::BFloat16* v_cache, const int64_t* table, int64_t kv_head, Row* rows,
             int64_t count, int64_t padded) {
  constexpr int64_t kSpanBlocks = kAheadBlocks, kWidth = 32;
  const int64_t longest = rows[count - 1].length, blocks = padded / kBlock;
  for (int64_t r = 0; r < count; ++r) std::fill(rows[r].sums, rows[r].sums + GROUP * p.head_dim, 0.0f);
  const c10::BFloat16* span[kSpanBlocks];
  for (int64_t start = 0; start < longest; start += kSpanBlocks * kBlock) {
    const int64_t first_block = start / kBlock, span_blocks = std::min(kSpanBlocks, blocks - first_block);
    for (int64_t b = first_block + span_blocks; b < std::min(blocks, first_block + 2 * kSpanBlocks); ++b)
      fetch_to_l2(head_block(v_cache, p, table[b], kv_head), p.head_dim * kBlock);
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += kWidth) {
      for (int64_t i = 0; i < span_blocks; ++i)
        span[i] = head_block(v_cache, p, table[first_block + i], kv_head) + d0;
      for (int64_t r = 0; r < count; ++r) {
        const int64_t tokens = std::min(kSpanBlocks * kBlock, rows[r].length - start);
        const c10::BFloat16* probabilities = rows[r].bf16_probabilities + start;
        if (tokens > 0) pv_span_bf16<GROUP>(probabilities, padded, span, p.head_dim, tokens, rows[r].sums + d0);
      }
    }
  }
}
#endif

// scores -> probabilities, added to the row's `received` (if not null) for the importance of its tokens.
// The bf16 products' scores are scaled here, their probabilities rounded to bf16 for p.v.
template <typename T, typename C, int GROUP>
void normalise(const DecodeProblem& p, const Row& row, int64_t padded, float* received) {
  for (int g = 0; g < GROUP; ++g) {
    float* s = row.scores + g * padded;
    if constexpr (kDotBf16<T, C>)
      for (int64_t j = 0; j < row.length; ++j) s[j] *= p.scale;
    const float inverse = 1.0f / softmax_numerators(s, row.length, padded);
    for (int64_t j = 0; j < row.length; ++j) s[j] *= inverse;
    if (received != nullptr)
      for (int64_t j = 0; j < row.length; ++j) received[j] += s[j];
#ifdef __AVX512BF16__
    if constexpr (kDotBf16<T, C>) round_to_bf16(s, padded, row.bf16_probabilities + g * padded);
#endif
  }
}

// received_parts, if not null: a (rows, kv_heads, max_context) row per row and KV head to add to.
template <typename T, typename C, int GROUP>
void attend(const DecodeProblem& p, const T* q, const C* k_cache, const C* v_cache, const Item& item,
            std::vector<float>& buffer, T* out, float* received_parts) {
  const int64_t hd = p.head_dim, longest = p.lens[item.first_row + item.rows - 1];
  const int64_t padded = (longest + kBlock - 1) / kBlock * kBlock;
  const int64_t per_row = GROUP * (2 * hd + padded + padded / 2);  // queries, sums, scores, bf16 probabilities
  buffer.resize(item.rows * per_row);
  Row rows[kItemRows];
  for (int64_t r = 0; r < item.rows; ++r) {
    const int64_t index = item.first_row + r;
    float* start = buffer.data() + r * per_row;
    const T* q_rows = q + index * p.q_stride + item.kv_head * GROUP * hd;
    rows[r] = {index, p.lens[index], start, start + GROUP * hd, start + 2 * GROUP * hd, nullptr,
               reinterpret_cast<c10::BFloat16*>(start + GROUP * (2 * hd + padded))};
    if constexpr (kDotBf16<T, C>)
      rows[r].bf16_query = q_rows;
    else
      for (int64_t i = 0; i < GROUP * hd; ++i) rows[r].query[i] = static_cast<float>(q_rows[i]) * p.scale;
  }
  const int64_t* table = p.tables + item.first_row * p.max_blocks;
  qk<T, C, GROUP>(p, k_cache, table, item.kv_head, rows, item.rows, padded);
  for (int64_t r = 0; r < item.rows; ++r) {
    const int64_t part = rows[r].index * p.kv_heads + item.kv_head;
    float* received = received_parts != nullptr ? received_parts + part * p.max_context : nullptr;
    normalise<T, C, GROUP>(p, rows[r], padded, received);
  }
#ifdef __AVX512BF16__
  if constexpr (kDotBf16<T, C>)
    pv_bf16<GROUP>(p, v_cache, table, item.kv_head, rows, item.rows, padded);
  else
#endif
    pv<C, GROUP>(p, v_cache, table, item.kv_head, rows, item.rows, padded);
  for (int64_t r = 0; r < item.rows; ++r) {
    T* o = out + (rows[r].index * p.heads + item.kv_head * GROUP) * hd;
    for (int64_t i = 0; i < GROUP * hd; ++i) o[i] = static_cast<T>(rows[r].sums[i]);
  }
}

// Work items: runs of consecutive rows with the same block table, by kItemRows, in rows of nondecreasing
// length (a draft's rows see one more token each), times the KV heads.
std::vector<Item> items_of(const DecodeProblem& p, int64_t rows) {
  std::vector<Item> items;
  for (int64_t row = 0; row < rows;) {
    int64_t count = 1;
    const int64_t* table = p.tables + row * p.max_blocks;
    while (row + count < rows && count < kItemRows && p.lens[row + count] >= p.lens[row + count - 1] &&
           std::equal(table, table + p.max_blocks, table + count * p.max_blocks))
      ++count;
    for (int64_t kv_head = 0; kv_head < p.kv_heads; ++kv_head) items.push_back({row, count, kv_head});
    row += count;
  }
  return items;
}

// Where each thread's contiguous run of items starts (and the last ends), cut where the items' work is
// about equal: a row costs its tokens of context and a block's worth more.  A step's sequences differ in
// length by tens of times, and an even split by count kept one thread waiting for the other: OpenMP's
// wait took 18.6 % of the samples of 32-sequence decode steps (40-728 tokens of prompt).
std::vector<int64_t> balanced_cuts(const DecodeProblem& p, const std::vector<Item>& items, int64_t threads) {
  std::vector<int64_t> work(items.size() + 1, 0);  // work[i]: the items before i
  for (size_t i = 0; i < items.size(); ++i) {
    work[i + 1] = work[i];
    for (int64_t r = 0; r < items[i].rows; ++r) work[i + 1] += p.lens[items[i].first_row + r] + kBlock;
  }
  std::vector<int64_t> cuts(threads + 1, static_cast<int64_t>(items.size()));
  cuts[0] = 0;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t target = work.back() * t / threads;
    int64_t cut = std::lower_bound(work.begin(), work.end(), target) - work.begin();
    if (cut > 0 && target - work[cut - 1] < work[cut] - target) --cut;  // the nearer of the two
    cuts[t] = std::max(cut, cuts[t - 1]);
  }
  return cuts;
}

template <typename T, typename C, int GROUP>
void attend_all(const DecodeProblem& p, int64_t rows, const T* q, const C* k_cache, const C* v_cache, T* out,
                float* received_parts) {
  const std::vector<Item> items = items_of(p, rows);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(items.size()));
  const std::vector<int64_t> cuts = balanced_cuts(p, items, threads);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer;
    // Each row and KV head adds to a row of its own, summed over heads afterwards: no two threads share one.
    for (int64_t i = cuts[begin]; i < cuts[end]; ++i)
      attend<T, C, GROUP>(p, q, k_cache, v_cache, items[i], buffer, out, received_parts);
  });
}

}  // namespace

template <typename T, typename C>
void decode_attention_rows(const DecodeProblem& p, int64_t rows, const T* q, const C* k_cache, const C* v_cache,
                           T* out, float* received_parts) {
  with_constant<8>(p.heads / p.kv_heads, [&](auto group) {
    attend_all<T, C, decltype(group)::value>(p, rows, q, k_cache, v_cache, out, received_parts);
  });
}

#define KVCHAT_DECODE_ATTENTION_ROWS(T, C) \
  template void decode_attention_rows(const DecodeProblem&, int64_t, const T*, const C*, const C*, T*, float*);
KVCHAT_FOR_DECODE_KV_PAIRS(KVCHAT_DECODE_ATTENTION_ROWS)

namespace {

void check(const torch::Tensor& k_cache, const torch::Tensor& v_cache, const torch::Tensor& block_tables,
           const torch::Tensor& context_lens, int64_t heads, int64_t head_dim) {
  for (const auto& cache : {k_cache, v_cache})
    TORCH_CHECK(cache.is_contiguous() && cache.dim() == 4 && cache.scalar_type() == k_cache.scalar_type(),
                "caches must be contiguous 4-d tensors of one dtype");
  TORCH_CHECK(k_cache.size(3) == kBlock && v_cache.size(2) == kBlock, "the kernel needs blocks of 16 tokens");
  TORCH_CHECK(k_cache.size(2) == head_dim && head_dim % 32 == 0, "head_dim must be a multiple of 32");
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
  const DecodeProblem p{heads,
                        q.size(2),
                        kv_heads,
                        block_tables.size(1),
                        max_context,
                        heads * q.size(2),
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
    decode_attention_rows(p, seqs, q.data_ptr<T>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(), out.data_ptr<T>(),
                          sum_attention ? received_parts.data_ptr<float>() : nullptr);
  });
  return {out, sum_attention ? received_parts.sum(1) : torch::Tensor()};
}

}  // namespace kvchat
