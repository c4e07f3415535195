// The two products of prefill attention on AMX tiles, for bf16 queries over a bf16 cache (amx.h).
//
// q.k: an A tile holds 16 rows' queries by 32 of head_dim, a B tile 16 pairs of head_dim by a block's 16
// keys (the block's keys interleaved by pairs of rows, pair_keys), and C the 16 rows' scores of the
// block.  p.v: an A tile holds 16 rows' probabilities (rounded to bf16 as the vector path rounds them)
// by 32 tokens, a B tile 16 pairs of tokens by 16 of head_dim (the values interleaved by pairs of
// tokens, pair_values), and four C tiles 16 rows by 64 of head_dim.  Each row's sums depend on that row
// alone and run over head_dim, or over the context from its first token in steps of 32, in the same
// order whatever the tile holds: a row gets the same bits however the prompt was cut into chunks.
// On a 2-core AMX Xeon, prefill attention of bench.throughput's offline prompts (10,851 tokens, SmolLM2)
// took 1.45 s on the vector pair products (attention_bf16.h) and 0.73 s here, where the softmax's
// exponentials take about as long as the products.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define KVCHAT_AMX_ATTENTION 1
#include "amx.h"
#include "attention_bf16.h"

namespace kvchat {

constexpr int64_t kPairedTokens = 2 * kTileRows;  // tokens per A tile of probabilities
constexpr int64_t kAmxColumns = 4 * kTileRows;    // head_dim per pass of p.v: four C tiles
constexpr int64_t kTileValues = kTileRows * kTileInputs;  // bf16 values per B tile

// A block's keys (head_dim, 16 tokens) -> (head_dim / 2, 16, 2): a B tile for each 32 of head_dim.
inline void pair_keys(const c10::BFloat16* keys, int64_t head_dim, c10::BFloat16* pairs) {
  const __m512i key_pairs = load_indices(kKeyPairs);
  for (int64_t d = 0; d < head_dim; d += 2)
    _mm512_storeu_si512(pairs + d * 16, _mm512_permutexvar_epi16(key_pairs, _mm512_loadu_si512(keys + d * 16)));
}

// scores[0:16][0:16] (row stride `stride` floats) = 16 rows of queries (bf16, head_dim each) . one block's
// key pairs.  Tiles: C 0, A 1, B 2.
inline void qk_tile(const c10::BFloat16* queries, int64_t head_dim, const c10::BFloat16* key_pairs, float* scores,
                    int64_t stride) {
  _tile_zero(0);
  for (int64_t k = 0; k < head_dim; k += kTileInputs) {
    _tile_loadd(1, queries + k, head_dim * sizeof(c10::BFloat16));
    _tile_loadd(2, key_pairs + k * kTileRows, 64);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, scores, stride * sizeof(float));
}

// The values of tokens [0, tokens) (`block_of(b)`: the context's value block b, 16 tokens by head_dim)
// -> for each 32 tokens, head_dim / 16 B tiles of (16 token pairs, 16 of head_dim, 2), one after another.
// Tokens from `tokens` to the next multiple of 32 are zeros: slots past the context may hold anything,
// NaN included, and a zero probability times NaN is NaN.
template <typename Blocks>
void pair_values(Blocks block_of, int64_t tokens, int64_t head_dim, c10::BFloat16* pairs) {
  const __m512i low = load_indices(kValuePairsLow), high = load_indices(kValuePairsHigh);
  auto value = [&](int64_t t, int64_t d) {
    return t < tokens ? _mm512_loadu_si512(block_of(t / 16) + t % 16 * head_dim + d) : _mm512_setzero_si512();
  };
  for (int64_t first = 0; first < tokens; first += kPairedTokens) {
    c10::BFloat16* chunk = pairs + first * head_dim;
    for (int64_t t = first; t < first + kPairedTokens; t += 2)
      for (int64_t d = 0; d < head_dim; d += 32) {
        const __m512i even = value(t, d), odd = value(t + 1, d);
        c10::BFloat16* row = chunk + d / 16 * kTileValues + (t - first) / 2 * kTileInputs;
        _mm512_storeu_si512(row, _mm512_permutex2var_epi16(even, low, odd));
        _mm512_storeu_si512(row + kTileValues, _mm512_permutex2var_epi16(even, high, odd));
      }
  }
}

// out[0:16][d0:d0 + 64] (row stride head_dim floats) = 16 rows of probabilities (bf16, row stride
// `stride`) . the value pairs, over `tokens` tokens (a multiple of 32).  Tiles: C 0-3, A 4, B 5-7.
inline void pv_tile(const c10::BFloat16* probabilities, int64_t stride, const c10::BFloat16* value_pairs,
                    int64_t head_dim, int64_t d0, int64_t tokens, float* out) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t first = 0; first < tokens; first += kPairedTokens) {
    const c10::BFloat16* pairs = value_pairs + first * head_dim + d0 / 16 * kTileValues;
    _tile_loadd(4, probabilities + first, stride * sizeof(c10::BFloat16));
    _tile_loadd(5, pairs, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, pairs + kTileValues, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, pairs + 2 * kTileValues, 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, pairs + 3 * kTileValues, 64);
    _tile_dpbf16ps(3, 4, 5);
  }
  const int64_t out_stride = head_dim * sizeof(float);
  _tile_stored(0, out + d0, out_stride);
  _tile_stored(1, out + d0 + kTileRows, out_stride);
  _tile_stored(2, out + d0 + 2 * kTileRows, out_stride);
  _tile_stored(3, out + d0 + 3 * kTileRows, out_stride);
}

}  // namespace kvchat

#endif
