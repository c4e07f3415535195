// Decode attention straight from the paged KV cache, for the CPU: q.k, softmax and p.v in one pass.
//
// The torch path gathers every sequence's blocks into a padded copy before attending; at decode time
// that copy costs more than the attention itself.  This kernel reads keys and values in place, through
// the block tables.  A work item is a KV head and up to four rows of one sequence (a step checking a
// draft has a row per draft token, and each block is read once for all of them, not once a row: a
// 4-sequence step with drafts of 6 at 600 tokens took 10.0 ms instead of 10.8 for SmolLM2's 30 layers on
// a 2-core AMX Xeon, little because the rows' arithmetic, not the reads, bounds it there).  Its scores
// for the query heads sharing the KV head (GROUP, a compile-time constant so their accumulators stay in
// registers) go to a buffer of the thread's that stays in L1, become probabilities there
// (normalised before p.v, as transformers does: dividing the sums afterwards parted an int8-KV session
// from its oracle at a 0.11 logit margin), and multiply the values.  Threads take an item's context by
// spans of 128 tokens where whole items would leave one idle (Attention::run).  One parallel region per
// layer, no scores tensor (two kernels and torch's softmax between them took three regions and 3-4x this
// time at 32 sequences of 400 tokens).
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
#include <array>
#include <atomic>
#include <thread>
#include <vector>

#include "kernels.h"
#include "kv_types.h"
#include "attention_bf16.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int64_t kVectors = kBlock / kWideLanes;
// Vectors of head_dim one p.v pass over a block accumulates in registers: up to 4, fewer where GROUP
// accumulators for each, the values and a weight would not fit in the registers (AVX2 has 16; GROUP 3 with 4
// spilled two accumulators, and each token waited on a store and a load).
constexpr int pass_vectors(int group) { return std::min(4, ((kWideLanes == kLanes ? 16 : 32) - 1) / (group + 1)); }
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

// Before block b of a sequence's `blocks` is computed: the one kAheadBlocks on (at `start`, the first a
// thread computes in a row, all of those up to it).
template <typename C>
inline void fetch_ahead(const C* cache, const DecodeProblem& p, const int64_t* table, int64_t kv_head, int64_t b,
                        int64_t start, int64_t blocks) {
  for (int64_t next = b == start ? 1 : kAheadBlocks; next <= kAheadBlocks && b + next < blocks; ++next)
    fetch_to_l2(head_block(cache, p, table[b + next], kv_head), p.head_dim * kBlock);
}

// A bf16 cache's 16 values in AVX2's two vectors come as the even- and the odd-indexed ones (load_pair: two
// instructions, where widening them in order took eight): a block row's keys as its even and odd tokens,
// a token's values as even and odd elements of head_dim; results go back in order when stored.  (A bf16
// cache has no scales to apply.)
template <typename C>
constexpr bool kPairs = std::is_same_v<C, c10::BFloat16> && kVectors == 2;

inline void store_in_order(float* target, vfloat even, vfloat odd) {
  store(target, __builtin_shufflevector(even, odd, 0, 8, 1, 9, 2, 10, 3, 11));
  store(target + kLanes, __builtin_shufflevector(even, odd, 4, 12, 5, 13, 6, 14, 7, 15));
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
      if constexpr (kPairs<C>)
        load_pair(keys + (d + c) * kBlock, row[0], row[1]);
      else
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
  if constexpr (kPairs<C>) {
    for (int g = 0; g < GROUP; ++g) store_in_order(scores + g * padded + first, acc[0][g][0], acc[0][g][1]);
    return;
  }
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
    if constexpr (kPairs<C>)
      for (int v = 0; v < VECTORS; v += 2) load_pair(values + t * head_dim + d0 + v * kWideLanes, row[v], row[v + 1]);
    else
      for (int v = 0; v < VECTORS; ++v) row[v] = load_wide(values + t * head_dim + d0 + v * kWideLanes);
    for (int g = 0; g < GROUP; ++g) {
      float weight = probabilities[g * padded + first + t];
      if constexpr (std::is_same_v<C, int8_t>) weight *= value_scales[t];
      for (int v = 0; v < VECTORS; ++v) acc[g][v] += weight * row[v];
    }
  }
  for (int g = 0; g < GROUP; ++g)
    for (int v = 0; v < VECTORS; ++v) store(sums + g * head_dim + d0 + v * kWideLanes, acc[g][v]);
}

// The unit of work threads share: a span of kSpanBlocks blocks of an item's context.  A row's p.v sums
// are taken span by span, each from zero, and added in span order, so its bits do not depend on how many
// threads shared its spans: one sequence's three KV heads on two cores, or 32 sequences.
constexpr int64_t kSpanBlocks = kAheadBlocks;
constexpr int64_t kSpanTokens = kSpanBlocks * kBlock;

inline int64_t spans_of(int64_t length) { return (length + kSpanTokens - 1) / kSpanTokens; }

// One row's part of an item: its scaled query (the computing thread's), and in the item's memory its scores
// (probabilities once normalised) and each span's p.v sums.  The rows of an item share its sequence's
// blocks, each with its own length.
struct Row {
  int64_t index, length;
  float *query, *scores, *span_sums;  // span_sums: (spans, GROUP, head_dim)
  const c10::BFloat16* bf16_query;     // the bf16 products' query, as it is
  c10::BFloat16* bf16_probabilities;  // the bf16 products' probabilities (GROUP, padded)
};

// Every row's scores over the span's blocks, in order, later ones fetched while one is computed.
template <typename T, typename C, int GROUP>
void qk(const DecodeProblem& p, const C* k_cache, const int64_t* table, int64_t kv_head, Row* rows, int64_t count,
        int64_t padded, int64_t span) {
  const int64_t blocks = padded / kBlock, start = span * kSpanBlocks;
  for (int64_t b = start; b < std::min(blocks, start + kSpanBlocks); ++b) {
    const int64_t first = b * kBlock;
    const C* keys = head_block(k_cache, p, table[b], kv_head);
    fetch_ahead(k_cache, p, table, kv_head, b, start, blocks);
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

// Every row's span sums[g][0:head_dim] = probabilities[g] . values over the span, pass_vectors(GROUP) vectors
// of head_dim per pass over a block: GROUP times as many chains of FMAs, enough to hide their latency.
template <typename C, int GROUP>
void pv(const DecodeProblem& p, const C* v_cache, const int64_t* table, int64_t kv_head, Row* rows, int64_t count,
        int64_t padded, int64_t span) {
  constexpr int PASS = kPairs<C> ? std::max(2, pass_vectors(GROUP) / 2 * 2) : pass_vectors(GROUP);
  const int64_t blocks = padded / kBlock, start = span * kSpanBlocks;
  for (int64_t r = 0; r < count; ++r) {
    float* sums = rows[r].span_sums + span * GROUP * p.head_dim;
    std::fill(sums, sums + GROUP * p.head_dim, 0.0f);
  }
  for (int64_t b = start; b < std::min(blocks, start + kSpanBlocks); ++b) {
    const int64_t first = b * kBlock;
    const C* values = head_block(v_cache, p, table[b], kv_head);
    fetch_ahead(v_cache, p, table, kv_head, b, start, blocks);
    const float* value_scales = block_scales(p.v_scales, p, table[b], kv_head);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t tokens = std::min(kBlock, rows[r].length - first);
      float* sums = rows[r].span_sums + span * GROUP * p.head_dim;
      for (int64_t d0 = 0; tokens > 0 && d0 < p.head_dim; d0 += PASS * kWideLanes) {
        with_constant<PASS>((p.head_dim - d0) / kWideLanes, [&](auto vectors) {
          pv_block<C, GROUP, decltype(vectors)::value>(rows[r].scores, padded, values, value_scales, first, tokens,
                                                       p.head_dim, d0, sums);
        });
      }
    }
  }
  if constexpr (kPairs<C>)
    for (int64_t r = 0; r < count; ++r) {
      float* sums = rows[r].span_sums + span * GROUP * p.head_dim;
      for (int64_t i = 0; i < GROUP * p.head_dim; i += 2 * kLanes) {
        store_in_order(sums + i, load_lanes(sums + i), load_lanes(sums + i + kLanes));
      }
    }
}

#ifdef __AVX512BF16__
// pv with the bf16 products: 32 elements of head_dim per pass over the span, whose next span is fetched
// while this one is computed.
template <int GROUP>
void pv_bf16(const DecodeProblem& p, const c10::BFloat16* v_cache, const int64_t* table, int64_t kv_head, Row* rows,
             int64_t count, int64_t padded, int64_t span) {
  constexpr int64_t kWidth = 32;
  const int64_t blocks = padded / kBlock, first_block = span * kSpanBlocks, start = span * kSpanTokens;
  const int64_t span_blocks = std::min(kSpanBlocks, blocks - first_block);
  for (int64_t b = first_block + span_blocks; b < std::min(blocks, first_block + 2 * kSpanBlocks); ++b)
    fetch_to_l2(head_block(v_cache, p, table[b], kv_head), p.head_dim * kBlock);
  for (int64_t r = 0; r < count; ++r) {
    float* sums = rows[r].span_sums + span * GROUP * p.head_dim;
    std::fill(sums, sums + GROUP * p.head_dim, 0.0f);
  }
  const c10::BFloat16* values[kSpanBlocks];
  for (int64_t d0 = 0; d0 < p.head_dim; d0 += kWidth) {
    for (int64_t i = 0; i < span_blocks; ++i) values[i] = head_block(v_cache, p, table[first_block + i], kv_head) + d0;
    for (int64_t r = 0; r < count; ++r) {
      const int64_t tokens = std::min(kSpanTokens, rows[r].length - start);
      const c10::BFloat16* probabilities = rows[r].bf16_probabilities + start;
      float* sums = rows[r].span_sums + span * GROUP * p.head_dim + d0;
      if (tokens > 0) pv_span_bf16<GROUP>(probabilities, padded, values, p.head_dim, tokens, sums);
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

// Up to kItemRows rows of one sequence (a step checking a draft has a row for its last token and one per
// draft token) and one KV head: each block is read from memory once for all of them, and each row computes
// what it would alone, in the same order, so a drafted step's rows keep the bits of the step without drafts.
constexpr int64_t kItemRows = 4;
struct Item {
  int64_t first_row, rows, kv_head;
  int64_t padded, spans, first_unit;  // context padded to whole blocks; its spans, numbered from first_unit
  float* memory;  // where threads share it: the rows' scores, bf16 probabilities and span sums
};

// Where threads share an item's spans: its spans whose q.k / p.v is still to compute, and whether its rows'
// probabilities are ready for p.v (the thread that computes the last q.k span normalises them).
struct Progress {
  std::atomic<int64_t> qk_left, pv_left;
  std::atomic<bool> normalised;
};

// The floats of an item's memory: its rows' scores, bf16 probabilities and span sums.
inline int64_t memory_floats(const Item& item, int64_t group, int64_t head_dim) {
  return item.rows * group * (item.padded + item.padded / 2 + item.spans * head_dim);
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
    const int64_t longest = p.lens[row + count - 1], padded = (longest + kBlock - 1) / kBlock * kBlock;
    for (int64_t kv_head = 0; kv_head < p.kv_heads; ++kv_head) {
      const int64_t first_unit = items.empty() ? 0 : items.back().first_unit + items.back().spans;
      items.push_back({row, count, kv_head, padded, spans_of(longest), first_unit, nullptr});
    }
    row += count;
  }
  return items;
}

// Each unit's work (a row costs its tokens in the span, and a block's worth more), summed: work[u] is the
// units' before u, one unit a span of an item, the items' spans in turn.
std::vector<int64_t> unit_work(const DecodeProblem& p, const std::vector<Item>& items) {
  std::vector<int64_t> work{0};
  for (const Item& item : items)
    for (int64_t span = 0; span < item.spans; ++span) {
      int64_t cost = kBlock;
      for (int64_t r = 0; r < item.rows; ++r)
        cost += std::clamp(p.lens[item.first_row + r] - span * kSpanTokens, int64_t{0}, kSpanTokens);
      work.push_back(work.back() + cost);
    }
  return work;
}

// Where each thread's contiguous run of units starts (and the last ends), cut where their work is about
// equal.  A step's sequences differ in length by tens of times, and an even split by count kept one thread
// waiting for the other: OpenMP's wait took 18.6 % of the samples of 32-sequence decode steps (40-728 tokens
// of prompt).  Whole items alone left one sequence's three KV heads on two cores one thread's work apart.
std::vector<int64_t> balanced_cuts(const std::vector<int64_t>& work, int64_t threads) {
  const int64_t units = static_cast<int64_t>(work.size()) - 1;
  std::vector<int64_t> cuts(threads + 1, units);
  cuts[0] = 0;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t target = work.back() * t / threads;
    int64_t cut = std::lower_bound(work.begin(), work.end(), target) - work.begin();
    if (cut > 0 && target - work[cut - 1] < work[cut] - target) --cut;  // the nearer of the two
    cuts[t] = std::max(cut, cuts[t - 1]);
  }
  return cuts;
}

// Spins until another thread sets `flag`, yielding the core now and then in case that thread needs it.
inline void wait_for(const std::atomic<bool>& flag) {
  for (int64_t spins = 1; !flag.load(std::memory_order_acquire); ++spins)
    if (spins % 1024 == 0) std::this_thread::yield();
}

// One call's attention: its items, whose spans threads take in contiguous runs.
template <typename T, typename C, int GROUP>
struct Attention {
  const DecodeProblem& p;
  const T* q;
  const C *k_cache, *v_cache;
  T* out;
  // If not null: a (rows, kv_heads, max_context) row per row and KV head to add to, summed over heads
  // afterwards; the thread that normalises a row adds to it, so no two threads add to one.
  float* received_parts;
  const std::vector<Item>& items;
  std::vector<Progress>& progress;

  // A thread's units [first, last): the q.k of items it shares with others first and their p.v last, so
  // that the thread that normalises an item seldom keeps another waiting; the items it has alone between.
  [[gnu::flatten]] void run(int64_t first, int64_t last) const {
    std::vector<float> queries, memory;  // memory: of the items the thread has alone, one at a time
    Row rows[kItemRows];
    std::vector<std::array<int64_t, 3>> shared;  // item, first span, end span
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& item = items[i];
      const int64_t begin = std::max(first, item.first_unit), end = std::min(last, item.first_unit + item.spans);
      if (begin < end && end - begin < item.spans)
        shared.push_back({static_cast<int64_t>(i), begin - item.first_unit, end - item.first_unit});
    }
    for (const auto [i, begin, end] : shared) {
      rows_of(items[i], items[i].memory, queries, rows);
      qk_spans(items[i], rows, begin, end);
      if (progress[i].qk_left.fetch_sub(end - begin, std::memory_order_acq_rel) == end - begin) {
        normalise_all(items[i], rows);
        progress[i].normalised.store(true, std::memory_order_release);
      }
    }
    for (const Item& item : items)
      if (item.first_unit >= first && item.first_unit + item.spans <= last) whole(item, memory, queries, rows);
    for (const auto [i, begin, end] : shared) {
      wait_for(progress[i].normalised);
      rows_of(items[i], items[i].memory, queries, rows);
      pv_spans(items[i], rows, begin, end);
      if (progress[i].pv_left.fetch_sub(end - begin, std::memory_order_acq_rel) == end - begin)
        write_out(items[i], rows);
    }
  }

  void whole(const Item& item, std::vector<float>& memory, std::vector<float>& queries, Row* rows) const {
    memory.resize(memory_floats(item, GROUP, p.head_dim));
    rows_of(item, memory.data(), queries, rows);
    qk_spans(item, rows, 0, item.spans);
    normalise_all(item, rows);
    pv_spans(item, rows, 0, item.spans);
    write_out(item, rows);
  }

  void qk_spans(const Item& item, Row* rows, int64_t begin, int64_t end) const {
    for (int64_t span = begin; span < end; ++span)
      qk<T, C, GROUP>(p, k_cache, table(item), item.kv_head, rows, item.rows, item.padded, span);
  }

  const int64_t* table(const Item& item) const { return p.tables + item.first_row * p.max_blocks; }

  // The item's rows: scores, bf16 probabilities and span sums in `memory`, scaled queries in `queries`.
  void rows_of(const Item& item, float* memory, std::vector<float>& queries, Row* rows) const {
    const int64_t hd = p.head_dim, per_row = GROUP * (item.padded + item.padded / 2);
    queries.resize(item.rows * GROUP * hd);
    for (int64_t r = 0; r < item.rows; ++r) {
      const int64_t index = item.first_row + r;
      float* scores = memory + r * per_row;
      float* span_sums = memory + item.rows * per_row + r * item.spans * GROUP * hd;
      rows[r] = {index, p.lens[index], queries.data() + r * GROUP * hd, scores, span_sums, nullptr,
                 reinterpret_cast<c10::BFloat16*>(scores + GROUP * item.padded)};
      const T* q_rows = q + index * p.q_stride + item.kv_head * GROUP * hd;
      if constexpr (kDotBf16<T, C>)
        rows[r].bf16_query = q_rows;
      else
        for (int64_t i = 0; i < GROUP * hd; ++i) rows[r].query[i] = static_cast<float>(q_rows[i]) * p.scale;
    }
  }

  void normalise_all(const Item& item, const Row* rows) const {
    for (int64_t r = 0; r < item.rows; ++r) {
      const int64_t part = rows[r].index * p.kv_heads + item.kv_head;
      normalise<T, C, GROUP>(p, rows[r], item.padded,
                             received_parts != nullptr ? received_parts + part * p.max_context : nullptr);
    }
  }

  void pv_spans(const Item& item, Row* rows, int64_t begin, int64_t end) const {
    for (int64_t span = begin; span < end; ++span) {
#ifdef __AVX512BF16__
      if constexpr (kDotBf16<T, C>) {
        pv_bf16<GROUP>(p, v_cache, table(item), item.kv_head, rows, item.rows, item.padded, span);
        continue;
      }
#endif
      pv<C, GROUP>(p, v_cache, table(item), item.kv_head, rows, item.rows, item.padded, span);
    }
  }

  // Each row's output: its spans' sums added in span order.
  void write_out(const Item& item, const Row* rows) const {
    const int64_t size = GROUP * p.head_dim;
    for (int64_t r = 0; r < item.rows; ++r) {
      float* sums = rows[r].span_sums;
      for (int64_t span = 1; span < spans_of(rows[r].length); ++span)
        for (int64_t i = 0; i < size; ++i) sums[i] += sums[span * size + i];
      T* o = out + (rows[r].index * p.heads + item.kv_head * GROUP) * p.head_dim;
      for (int64_t i = 0; i < size; ++i) o[i] = static_cast<T>(sums[i]);
    }
  }
};

// Memory in `shared` for each item a cut falls inside of (the others' is their thread's own).
void share_memory(std::vector<Item>& items, const std::vector<int64_t>& cuts, int64_t group, int64_t head_dim,
                  std::vector<float>& shared) {
  std::vector<std::pair<Item*, int64_t>> offsets;  // item, its first float
  int64_t floats = 0;
  for (Item& item : items) {
    const auto inside = [&](int64_t cut) { return cut > item.first_unit && cut < item.first_unit + item.spans; };
    if (std::none_of(cuts.begin(), cuts.end(), inside)) continue;
    offsets.push_back({&item, floats});
    floats += memory_floats(item, group, head_dim);
  }
  shared.resize(std::max<size_t>(shared.size(), floats));
  for (const auto& [item, offset] : offsets) item->memory = shared.data() + offset;
}

template <typename T, typename C, int GROUP>
void attend_all(const DecodeProblem& p, int64_t rows, const T* q, const C* k_cache, const C* v_cache, T* out,
                float* received_parts) {
  std::vector<Item> items = items_of(p, rows);
  const std::vector<int64_t> work = unit_work(p, items);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(work.size()) - 1);
  const std::vector<int64_t> cuts = balanced_cuts(work, threads);
  // The calling thread's, kept between calls: a long context's shared scores take no fresh pages each layer.
  thread_local std::vector<float> shared_memory;
  share_memory(items, cuts, GROUP, p.head_dim, shared_memory);
  std::vector<Progress> progress(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    progress[i].qk_left = progress[i].pv_left = items[i].spans;
    progress[i].normalised = false;
  }
  const Attention<T, C, GROUP> attention{p, q, k_cache, v_cache, out, received_parts, items, progress};
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) { attention.run(cuts[begin], cuts[end]); });
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
