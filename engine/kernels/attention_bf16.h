// The two products of attention (prefill and decode) on AVX-512 BF16 units, for bf16 queries over a bf16 cache.
//
// vdpbf16ps multiplies pairs of bf16 values and adds both products to a float32 lane: twice the
// multiplications of a float32 FMA per instruction.  q.k pairs consecutive head_dim elements: a block's
// keys d and d + 1 (two rows of 16 tokens, one after the other) are interleaved into one vector, and a
// query's elements d and d + 1 are broadcast against it.  p.v pairs consecutive tokens: tokens t and
// t + 1's values are interleaved, and a row's probabilities t and t + 1, rounded to bf16 as torch's
// CPU flash attention rounds them, are broadcast.  Sums stay float32.
#pragma once

#ifdef __AVX512BF16__
#include <immintrin.h>

#include <array>

#include "simd.h"

namespace kvchat {

template <typename T, typename C>
constexpr bool kDotBf16 = std::is_same_v<T, c10::BFloat16> && std::is_same_v<C, c10::BFloat16>;

// Indices for vpermw / vpermt2w that put element i of `first` at 2i and element i of `second` at 2i + 1,
// for i in [offset, offset + 16); `second` is numbered from `second_start` (16 in one vector, 32 in two).
constexpr std::array<uint16_t, 32> interleaving(uint16_t offset, uint16_t second_start) {
  std::array<uint16_t, 32> indices{};
  for (uint16_t i = 0; i < 16; ++i) {
    indices[2 * i] = offset + i;
    indices[2 * i + 1] = second_start + offset + i;
  }
  return indices;
}

alignas(64) constexpr std::array<uint16_t, 32> kKeyPairs = interleaving(0, 16);
alignas(64) constexpr std::array<uint16_t, 32> kValuePairsLow = interleaving(0, 32);
alignas(64) constexpr std::array<uint16_t, 32> kValuePairsHigh = interleaving(16, 32);

inline __m512i load_indices(const std::array<uint16_t, 32>& indices) { return _mm512_load_si512(indices.data()); }

inline __m512bh broadcast_pair(const c10::BFloat16* pair) {
  int32_t bits;
  std::memcpy(&bits, pair, sizeof(bits));
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(bits));
}

// s[r][0:16] = q[r] . the block's 16 keys (head_dim, 16), for M rows of q (unscaled).  CHAINS
// accumulators a row (pairs of d in turn, summed at the end) hide the dot product's latency where M rows
// alone are too few; a caller keeps CHAINS fixed, so that a row's sums never depend on M.
template <int M, int CHAINS = 1>
void qk_block_bf16(const c10::BFloat16* q, int64_t head_dim, const c10::BFloat16* keys, float* s,
                   int64_t stride) {
  const __m512i key_pairs = load_indices(kKeyPairs);
  __m512 acc[CHAINS][M];
  for (int c = 0; c < CHAINS; ++c)
    for (int r = 0; r < M; ++r) acc[c][r] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 2 * CHAINS) {
    for (int c = 0; c < CHAINS; ++c) {
      const __m512i two_rows = _mm512_loadu_si512(keys + (d + 2 * c) * 16);
      const __m512bh pairs = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(key_pairs, two_rows));
      for (int r = 0; r < M; ++r)
        acc[c][r] = _mm512_dpbf16_ps(acc[c][r], broadcast_pair(q + r * head_dim + d + 2 * c), pairs);
    }
  }
  for (int r = 0; r < M; ++r) {
    for (int c = 1; c < CHAINS; ++c) acc[0][r] = _mm512_add_ps(acc[0][r], acc[c][r]);
    _mm512_storeu_ps(s + r * stride, acc[0][r]);
  }
}

// out[r][0:32] += p[r][t] * value t[0:32] for the span's first `tokens` tokens, for M rows; `blocks` are
// the span's value blocks (16 tokens, head_dim), already offset to the 32 elements.  A last odd token
// is paired with zeros: the slot after it may hold anything, NaN included.
template <int M>
void pv_span_bf16(const c10::BFloat16* p, int64_t stride, const c10::BFloat16* const* blocks, int64_t head_dim,
                  int64_t tokens, float* out) {
  const __m512i low_pairs = load_indices(kValuePairsLow), high_pairs = load_indices(kValuePairsHigh);
  __m512 acc[M][2];
  for (int r = 0; r < M; ++r) {
    acc[r][0] = _mm512_loadu_ps(out + r * head_dim);
    acc[r][1] = _mm512_loadu_ps(out + r * head_dim + 16);
  }
  for (int64_t t = 0; t < tokens; t += 2) {
    const c10::BFloat16* value = blocks[t / 16] + t % 16 * head_dim;
    const __m512i first = _mm512_loadu_si512(value);
    const __m512i second = t + 1 < tokens ? _mm512_loadu_si512(value + head_dim) : _mm512_setzero_si512();
    const __m512bh low = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(first, low_pairs, second));
    const __m512bh high = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(first, high_pairs, second));
    for (int r = 0; r < M; ++r) {
      const __m512bh weights = broadcast_pair(p + r * stride + t);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], weights, low);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], weights, high);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm512_storeu_ps(out + r * head_dim, acc[r][0]);
    _mm512_storeu_ps(out + r * head_dim + 16, acc[r][1]);
  }
}

// p[0:length] = s[0:length] in bf16, rounded to nearest even; length a multiple of 16.
inline void round_to_bf16(const float* s, int64_t length, c10::BFloat16* p) {
  for (int64_t j = 0; j < length; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(s + j))));
}

}  // namespace kvchat

#else

namespace kvchat {
template <typename T, typename C>
constexpr bool kDotBf16 = false;
}  // namespace kvchat

#endif
