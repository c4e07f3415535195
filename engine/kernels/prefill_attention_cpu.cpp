// Prefill attention straight from the paged KV cache, for the CPU.
//
// A chunk of a chat turn attends to its session's cached tokens (often thousands) and causally to
// itself.  torch's SDPA needed that context gathered out of the blocks and a mask, and ran each query
// head alone; at turn 10 of a chat it took most of the step.  Here a work item is one KV head and a
// tile of chunk positions, and its rows are those positions times the query heads sharing the KV head,
// so each key and value block read serves all of them.  The tile's scores over its whole context go to
// a per-thread buffer (an exact two-pass softmax, no rescaling) and multiply the values; each output row
// is divided by its softmax sum at the end.  Rows go kRows at a time against 2 * kLanes keys (q.k) or
// value elements (p.v): 12 accumulators, what AVX2's 16 registers hold beside the operands.  Where the
// CPU has AVX-512 BF16, bf16 queries over a bf16 cache take its pair dot products instead
// (attention_bf16.h), 12 rows at a time: a prefill step's attention took a third of the step.
// Where it also has AMX tiles, the two products run on them (prefill_tiles_amx.h), 32 rows per item.
//
// The probabilities exist here anyway, so the kernel also sums those of the chunk's last `window`
// positions over rows and heads: the attention each token received, which session eviction keeps tokens
// by (engine/layers/importance.py).
//
// An int8 cache is read as it is: each score is multiplied by its key's scale before the softmax, and each
// probability by its value's scale before p.v (the softmax sum is taken before), so no float copy of
// the cache is made.
//
// q (chunk, heads, head_dim), heads and head_dim contiguous; k_cache (blocks, kv_heads, head_dim, 16);
// v_cache (blocks, kv_heads, 16, head_dim); block_table (context blocks,) int64; for an int8 cache,
// k_scales and v_scales (blocks, kv_heads, 16) float32.  Chunk position i is
// sequence position cached + i.  Returns out (chunk, heads, head_dim) and, when window > 0, the
// (cached + chunk,) float32 attention received.
#include <ATen/Parallel.h>

#include <cmath>

#include "amx.h"
#include "kernels.h"
#include "kv_types.h"
#include "prefill_tiles_amx.h"
#include "attention_bf16.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int kRows = 6;        // rows per register tile
constexpr int kRowsBf16 = 12;   // for the bf16 products, whose 32 registers hold twice as many
template <typename T, typename C>
constexpr int kRegisterRows = kDotBf16<T, C> ? kRowsBf16 : kRows;
constexpr int64_t kItemRows = 24;  // rows per work item: the key and value blocks stay in L1 across them
constexpr int64_t kAmxItemRows = 32;  // on AMX (KVCHAT_AMX_ATTENTION, prefill_tiles_amx.h): two tiles of rows
constexpr int64_t kSpanBlocks = 8;  // value blocks one pass of p.v keeps its accumulators in registers over

struct Problem {
  int64_t chunk, heads, kv_heads, group, head_dim, cached, context, q_stride;
  float scale;
  int64_t window, positions_per_tile, tiles, window_tiles;  // window_tiles: the last tiles, which hold it
  const float *k_scales, *v_scales;                         // an int8 cache's, else nullptr
  bool amx;                                                 // the bf16 products run on AMX tiles
};

// Keeps v in a register: without it GCC reads an operand shared by all rows from L1 once per row, as
// part of each FMA, and the loads, not the FMAs, set the pace.
inline void in_register(vfloat& v) { asm("" : "+x"(v)); }

// s[r][0:16] = q[r] . the block's 16 keys, for M rows.
template <typename C, int M>
void qk_block(const float* q, int64_t head_dim, const C* keys, float* s, int64_t stride) {
  vfloat acc[M][2];
  for (int r = 0; r < M; ++r) acc[r][0] = acc[r][1] = vfloat{};
  for (int64_t d = 0; d < head_dim; ++d) {
    vfloat k0 = load_lanes(keys + d * kBlock), k1 = load_lanes(keys + d * kBlock + kLanes);
    in_register(k0);
    in_register(k1);
    for (int r = 0; r < M; ++r) {
      const float x = q[r * head_dim + d];
      acc[r][0] += x * k0;
      acc[r][1] += x * k1;
    }
  }
  for (int r = 0; r < M; ++r) {
    store(s + r * stride, acc[r][0]);
    store(s + r * stride + kLanes, acc[r][1]);
  }
}

// out[r][0:16] += p[r][t] * value t[0:16] for the span's first `tokens` tokens, for M rows; `blocks` are
// the span's value blocks, already offset to the 16 elements.
template <typename C, int M>
void pv_span(const float* p, int64_t stride, const C* const* blocks, int64_t head_dim, int64_t tokens,
             float* out) {
  vfloat acc[M][2];
  for (int r = 0; r < M; ++r) {
    acc[r][0] = load_lanes(out + r * head_dim);
    acc[r][1] = load_lanes(out + r * head_dim + kLanes);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const C* value = blocks[t / kBlock] + t % kBlock * head_dim;
    vfloat v0 = load_lanes(value), v1 = load_lanes(value + kLanes);
    in_register(v0);
    in_register(v1);
    for (int r = 0; r < M; ++r) {
      const float w = p[r * stride + t];
      acc[r][0] += w * v0;
      acc[r][1] += w * v1;
    }
  }
  for (int r = 0; r < M; ++r) {
    store(out + r * head_dim, acc[r][0]);
    store(out + r * head_dim + kLanes, acc[r][1]);
  }
}

// s[0:length] *= scales[0:length]
void scale_row(float* s, const float* scales, int64_t length) {
  int64_t j = 0;
  for (; j + kLanes <= length; j += kLanes) store(s + j, load_lanes(s + j) * load_lanes(scales + j));
  for (; j < length; ++j) s[j] *= scales[j];
}

// s[0:length] *= factor
void scale_row(float* s, float factor, int64_t length) {
  int64_t j = 0;
  for (; j + kLanes <= length; j += kLanes) store(s + j, load_lanes(s + j) * factor);
  for (; j < length; ++j) s[j] *= factor;
}

// One KV head's scales of the context's blocks, in token order, into `gathered` (padded floats).
void gather_scales(const float* scales, const int64_t* table, int64_t kv_heads, int64_t kv_head, int64_t padded,
                   float* gathered) {
  for (int64_t b = 0; b < padded / kBlock; ++b)
    std::copy_n(scales + (table[b] * kv_heads + kv_head) * kBlock, kBlock, gathered + b * kBlock);
}

// A tile's working memory in a per-thread buffer: its rows' queries, output sums, scores (then
// probabilities), softmax sums, an int8 cache's scales in token order and, for the bf16 products, the
// probabilities rounded to bf16; on AMX, the keys of a block and the context's values in pairs.
struct TileBuffers {
  float *queries, *outputs, *scores, *sums, *key_scales, *value_scales;
  c10::BFloat16 *probabilities, *key_pairs, *value_pairs;

  TileBuffers(std::vector<float>& buffer, int64_t rows, int64_t head_dim, int64_t padded, bool amx) {
    const int64_t pairs = amx ? (kBlock + padded) * head_dim / 2 : 0;
    buffer.resize(rows * (2 * head_dim + padded + padded / 2 + 1) + 2 * padded + pairs);
    queries = buffer.data(), outputs = queries + rows * head_dim, scores = outputs + rows * head_dim;
    sums = scores + rows * padded, key_scales = sums + rows, value_scales = key_scales + padded;
    probabilities = reinterpret_cast<c10::BFloat16*>(value_scales + padded);
    key_pairs = probabilities + rows * padded, value_pairs = key_pairs + kBlock * head_dim;
  }
};

// The rows' queries: for the bf16 products as they are (the scores are scaled after), else as float32
// times the scale.
template <typename T, typename C>
void gather_queries(const Problem& p, const T* q, int64_t kv_head, int64_t first, int64_t rows, float* queries) {
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t hd = p.head_dim;
    const T* source = q + (first + row / p.group) * p.q_stride + (kv_head * p.group + row % p.group) * hd;
    if constexpr (kDotBf16<T, C>)
      std::copy_n(source, hd, reinterpret_cast<T*>(queries) + row * hd);
    else
      for (int64_t d = 0; d < hd; ++d) queries[row * hd + d] = static_cast<float>(source[d]) * p.scale;
  }
}

#ifdef KVCHAT_AMX_ATTENTION
// tile_scores on AMX tiles, 16 rows at a time (the rows are padded to 16; the padding's scores go unused).
template <typename Length>
void amx_scores(const Problem& p, const c10::BFloat16* k_cache, const int64_t* table, int64_t kv_head,
                int64_t rows, int64_t context, int64_t padded, const TileBuffers& tile, Length length_of) {
  const int64_t hd = p.head_dim;
  const auto* queries = reinterpret_cast<const c10::BFloat16*>(tile.queries);
  for (int64_t start = 0, b = 0; start < context; start += kBlock, ++b) {
    pair_keys(head_block(k_cache, p, table[b], kv_head), hd, tile.key_pairs);
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows)
      if (start < length_of(std::min(r0 + kTileRows, rows) - 1))
        qk_tile(queries + r0 * hd, hd, tile.key_pairs, tile.scores + r0 * padded + start, padded);
  }
}

// tile_values on AMX tiles: the context's values paired once, then 16 rows at a time over the tokens up
// to the last row's length, rounded up to 32 (the probabilities past a row's length are zeros).
template <typename Length>
void amx_values(const Problem& p, const c10::BFloat16* v_cache, const int64_t* table, int64_t kv_head,
                int64_t rows, int64_t context, int64_t padded, const TileBuffers& tile, Length length_of) {
  const int64_t hd = p.head_dim;
  auto block_of = [&](int64_t b) { return head_block(v_cache, p, table[b], kv_head); };
  pair_values(block_of, context, hd, tile.value_pairs);
  for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const int64_t length = length_of(std::min(r0 + kTileRows, rows) - 1);
    const int64_t tokens = (length + kPairedTokens - 1) / kPairedTokens * kPairedTokens;
    for (int64_t d0 = 0; d0 < hd; d0 += kAmxColumns)
      pv_tile(tile.probabilities + r0 * padded, padded, tile.value_pairs, hd, d0, tokens, tile.outputs + r0 * hd);
  }
}
#endif

// scores[row][0:length of the last row of its register tile] = q.k over the context's blocks.
template <typename T, typename C, typename Length>
void tile_scores(const Problem& p, const C* k_cache, const int64_t* table, int64_t kv_head, int64_t rows,
                 int64_t context, int64_t padded, const TileBuffers& tile, Length length_of) {
#ifdef KVCHAT_AMX_ATTENTION
  if constexpr (kDotBf16<T, C>)
    if (p.amx) return amx_scores(p, k_cache, table, kv_head, rows, context, padded, tile, length_of);
#endif
  constexpr int R = kRegisterRows<T, C>;
  const int64_t hd = p.head_dim;
  const float* queries = tile.queries;
  float* scores = tile.scores;
  for (int64_t start = 0, b = 0; start < context; start += kBlock, ++b) {
    const C* keys = head_block(k_cache, p, table[b], kv_head);
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
      with_constant<R>(rows - r0, [&](auto m) {
        constexpr int M = decltype(m)::value;
        if (start >= length_of(r0 + M - 1)) return;
#ifdef __AVX512BF16__
        if constexpr (kDotBf16<T, C>) {
          const T* q_rows = reinterpret_cast<const T*>(queries) + r0 * hd;
          return qk_block_bf16<M>(q_rows, hd, keys, scores + r0 * padded + start, padded);
        }
#endif
        qk_block<C, M>(queries + r0 * hd, hd, keys, scores + r0 * padded + start, padded);
      });
    }
  }
}

// outputs[row] = the sum over the row's context of its probabilities times the values.
template <typename T, typename C, typename Length>
void tile_values(const Problem& p, const C* v_cache, const int64_t* table, int64_t kv_head, int64_t rows,
                 int64_t context, int64_t padded, const TileBuffers& tile, Length length_of) {
#ifdef KVCHAT_AMX_ATTENTION
  if constexpr (kDotBf16<T, C>)
    if (p.amx) return amx_values(p, v_cache, table, kv_head, rows, context, padded, tile, length_of);
#endif
  constexpr int R = kRegisterRows<T, C>;
  constexpr int64_t kWidth = kDotBf16<T, C> ? 32 : 2 * kLanes;  // output elements per pass
  const int64_t hd = p.head_dim;
  std::fill(tile.outputs, tile.outputs + rows * hd, 0.0f);
  const C* blocks[kSpanBlocks];
  for (int64_t start = 0; start < context; start += kSpanBlocks * kBlock) {
    for (int64_t d0 = 0; d0 < hd; d0 += kWidth) {
      for (int64_t i = 0, b = start / kBlock; i < kSpanBlocks && b < padded / kBlock; ++i, ++b)
        blocks[i] = head_block(v_cache, p, table[b], kv_head) + d0;
      for (int64_t r0 = 0; r0 < rows; r0 += R) {
        with_constant<R>(rows - r0, [&](auto m) {
          constexpr int M = decltype(m)::value;
          const int64_t tokens = std::min(kSpanBlocks * kBlock, length_of(r0 + M - 1) - start);
          if (tokens <= 0) return;
          float* out = tile.outputs + r0 * hd + d0;
#ifdef __AVX512BF16__
          if constexpr (kDotBf16<T, C>)
            return pv_span_bf16<M>(tile.probabilities + r0 * padded + start, padded, blocks, hd, tokens, out);
#endif
          pv_span<C, M>(tile.scores + r0 * padded + start, padded, blocks, hd, tokens, out);
        });
      }
    }
  }
}

// One KV head over chunk positions [first, last): rows are (position, query head of the group) pairs.
template <typename T, typename C>
void attend_tile(const Problem& p, const T* q, const C* k_cache, const C* v_cache, const int64_t* table,
                 int64_t kv_head, int64_t first, int64_t last, std::vector<float>& buffer, T* out,
                 float* received) {
  const int64_t rows = (last - first) * p.group, hd = p.head_dim;
  // AMX takes whole tiles: 16 rows, 32 tokens of probabilities.
  const int64_t row_step = p.amx ? kTileRows : 1, token_step = p.amx ? 2 * kBlock : kBlock;
  const int64_t context = p.cached + last, padded = (context + token_step - 1) / token_step * token_step;
  const TileBuffers tile(buffer, (rows + row_step - 1) / row_step * row_step, hd, padded, p.amx);
  const bool int8 = p.k_scales != nullptr;
  if (int8) {
    gather_scales(p.k_scales, table, p.kv_heads, kv_head, padded, tile.key_scales);
    gather_scales(p.v_scales, table, p.kv_heads, kv_head, padded, tile.value_scales);
  }
  auto length_of = [&](int64_t row) { return p.cached + first + row / p.group + 1; };
  gather_queries<T, C>(p, q, kv_head, first, rows, tile.queries);
  tile_scores<T, C>(p, k_cache, table, kv_head, rows, context, padded, tile, length_of);
  for (int64_t row = 0; row < rows; ++row) {
    float* s = tile.scores + row * padded;
    if (int8) scale_row(s, tile.key_scales, length_of(row));
    if constexpr (kDotBf16<T, C>) scale_row(s, p.scale, length_of(row));
    tile.sums[row] = softmax_numerators(s, length_of(row), padded);
    if (received != nullptr && first + row / p.group >= p.chunk - p.window)
      for (int64_t j = 0; j < length_of(row); ++j) received[j] += s[j] / tile.sums[row];
    if (int8) scale_row(s, tile.value_scales, length_of(row));
#ifdef __AVX512BF16__
    if constexpr (kDotBf16<T, C>) round_to_bf16(s, padded, tile.probabilities + row * padded);
#endif
  }
  tile_values<T, C>(p, v_cache, table, kv_head, rows, context, padded, tile, length_of);
  for (int64_t row = 0; row < rows; ++row) {
    T* target = out + ((first + row / p.group) * p.heads + kv_head * p.group + row % p.group) * hd;
    for (int64_t d = 0; d < hd; ++d) target[d] = static_cast<T>(tile.outputs[row * hd + d] / tile.sums[row]);
  }
}

template <typename T, typename C>
void attend(const Problem& p, const T* q, const C* k_cache, const C* v_cache, const int64_t* table, T* out,
            float* received) {
  // Threads take contiguous ranges of items; ordering the tiles first, last, second, second to last...
  // gives each thread a fair share of the causal work, which grows with the position.
  at::parallel_for(0, p.tiles * p.kv_heads, 1, [&](int64_t begin, int64_t end) {
    if (p.amx) configure_tiles();
    std::vector<float> buffer;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t order = item / p.kv_heads, kv_head = item % p.kv_heads;
      const int64_t tile = order % 2 == 0 ? order / 2 : p.tiles - 1 - order / 2;
      const int64_t first = tile * p.positions_per_tile;
      const int64_t last = std::min(p.chunk, first + p.positions_per_tile);
      // Each (KV head, tile) that holds window positions sums into a row of its own: no two threads
      // ever add to the same row.
      const int64_t window_tile = tile - (p.tiles - p.window_tiles);
      float* item_received =
          window_tile >= 0 ? received + (kv_head * p.window_tiles + window_tile) * p.context : nullptr;
      attend_tile(p, q, k_cache, v_cache, table, kv_head, first, last, buffer, out, item_received);
    }
    if (p.amx) release_tiles();
  });
}

// Whether the bf16 products run on AMX tiles: bf16 queries over a bf16 cache, head_dim a multiple of
// their four C tiles' 64 columns, compiled for them and lent by Linux.
bool runs_on_amx(const torch::Tensor& q, const torch::Tensor& k_cache) {
#ifdef KVCHAT_AMX_ATTENTION
  return q.scalar_type() == torch::kBFloat16 && k_cache.scalar_type() == torch::kBFloat16 &&
         q.size(2) % kAmxColumns == 0 && amx_permitted();
#else
  return false;
#endif
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> paged_prefill_attention(
    torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_table, int64_t cached,
    double scale, int64_t window, std::optional<torch::Tensor> k_scales, std::optional<torch::Tensor> v_scales) {
  TORCH_CHECK(q.dim() == 3 && q.size(0) > 0, "q must be (chunk, heads, head_dim)");
  if (q.stride(2) != 1 || q.stride(1) != q.size(2)) q = q.contiguous();
  for (const auto& cache : {k_cache, v_cache})
    TORCH_CHECK(cache.dim() == 4 && cache.is_contiguous() && cache.scalar_type() == k_cache.scalar_type(),
                "caches must be contiguous 4-d tensors of one dtype");
  TORCH_CHECK(k_cache.size(3) == kBlock && v_cache.size(2) == kBlock, "the kernel needs blocks of 16 tokens");
  const int64_t chunk = q.size(0), heads = q.size(1), head_dim = q.size(2), kv_heads = k_cache.size(1);
  TORCH_CHECK(head_dim == k_cache.size(2) && head_dim % 32 == 0, "head_dim must be a multiple of 32");
  TORCH_CHECK(heads % kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_table.dim() == 1 && block_table.scalar_type() == torch::kLong && block_table.is_contiguous(),
              "block_table: 1-d int64");
  const int64_t context = cached + chunk;
  TORCH_CHECK(cached >= 0 && block_table.size(0) * kBlock >= context, "the block table is too short");
  const bool amx = runs_on_amx(q, k_cache);
  const int64_t group = heads / kv_heads;
  const int64_t positions_per_tile = std::max<int64_t>(1, (amx ? kAmxItemRows : kItemRows) / group);
  const int64_t tiles = (chunk + positions_per_tile - 1) / positions_per_tile;
  const int64_t window_tiles =
      window > 0 ? tiles - std::max<int64_t>(0, chunk - window) / positions_per_tile : 0;
  const Problem p{chunk,    heads,  kv_heads,          group,        head_dim,
                  cached,   context, q.stride(0),      static_cast<float>(scale), window,
                  positions_per_tile, tiles, window_tiles, kv_scales(k_cache, k_scales), kv_scales(v_cache, v_scales),
                  amx};
  auto out = torch::empty({chunk, heads, head_dim}, q.options().memory_format(at::MemoryFormat::Contiguous));
  auto received = torch::zeros({kv_heads * window_tiles, context}, q.options().dtype(torch::kFloat));
  dispatch_kv(q.scalar_type(), k_cache, "paged_prefill_attention", [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    attend<T, C>(p, q.data_ptr<T>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(), block_table.data_ptr<int64_t>(),
                 out.data_ptr<T>(), received.data_ptr<float>());
  });
  return {out, received.sum(0)};
}

}  // namespace kvchat
