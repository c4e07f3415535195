// x @ weight.T + bias in bf16 on AVX-512 BF16 units (and AMX tiles), for any number of rows.
//
// Between a few rows (few_rows_linear, bound by reading the weights) and a prefill chunk's hundreds
// (torch's product, near the units' peak), torch's product fell to a third of the units' peak with the
// weights streaming from memory: SmolLM2's 30 layers at 32 rows took 17.6 ms where reading the weights
// takes 5 and their arithmetic 8.  Here the weights are packed once, at load, so that one 64-byte vector
// holds 16 output columns times 2 consecutive inputs, the operand of the CPU's bf16 pair dot product
// (vdpbf16ps): a pair of x's values is broadcast against it and 16 columns advance two inputs in one
// instruction.  A work item is 32 output columns (16 at one row), whose packed weights are contiguous (the
// hardware prefetcher streams them) and stay in L1 while every group of 8 rows passes over them.  A
// column's sum is the same chain of instructions whatever the item's width and the rows beside it, so a
// token's numbers do not depend on what shares its step.  From a few rows on, the arithmetic slows the
// loop enough that the hardware prefetcher falls behind, so a row tile fetches the next item's weights
// while it computes (kPrefetchRows).
//
// Where the CPU has AMX tiles (and `in` is a multiple of 32), the same packed weights feed them instead:
// a tile multiply-add takes 16 rows by 32 inputs by 16 columns, so a product costs about what reading the
// weights costs up to dozens of rows (SmolLM2's 30 layers on a 2-core AMX Xeon: 8.7 ms at 1 row, 10.4 at
// 32, 13.6 at 64, where the vector path took 40 ms at 32 rows and oneDNN 12.6, 15.2 and 18.3).
//
// int8 weights (engine/quantization.py) are packed the same way, as sign and magnitude, and widened to
// bf16, which holds every int8 value exactly, by table lookups (Int8Widening): in registers where one row
// tile (up to 8 rows) passes over them, else a work item at a time into a buffer that stays in cache
// while the row tiles share it.  The widening costs once per step, where the few-row kernel widens for
// every row and torch's product needs a bf16 copy of every weight written to memory.  The lookups need
// AVX-512 VBMI, which every CPU with AVX-512 BF16 has but Cooper Lake; there torch's products run.
//
// packed (out / 16, in / 2, 16, 2) bf16 or int8, from pack_weight (int8's bytes reordered within it);
// x (rows, in) bf16; bias (out,) or none; int8 weights' scale (out,) float32.  The products accumulate in
// float32, are scaled and biased there, and are rounded to bf16 once.
#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>
#include <type_traits>

#include "amx.h"
#include "float_args.h"
#include "kernels.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int64_t kPanel = 16;  // output columns per packed panel: one vector of float32 sums
constexpr int kPanels = 2;      // panels per work item, and per AMX block
constexpr int kRowTile = 8;     // rows of x per register tile: 8 x 2 accumulators

}  // namespace

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
namespace {

// The tiles take a panel's packed values two input pairs at a time (64 values: 16 columns x 2 inputs,
// twice), as the bf16 pair dot product's operands.
struct Bf16Loading {
  void operator()(const c10::BFloat16* values, __m512bh& even, __m512bh& odd) const {
    even = reinterpret_cast<__m512bh>(_mm512_loadu_si512(values));
    odd = reinterpret_cast<__m512bh>(_mm512_loadu_si512(values + 32));
  }
};

// The bf16 bits of the integers 0-127 (exact: at most 7 significant bits), split into low and high bytes.
struct MagnitudeBytes {
  alignas(64) uint8_t low[128] = {};
  alignas(64) uint8_t high[128] = {};
};

constexpr MagnitudeBytes magnitude_bytes() {
  MagnitudeBytes bytes;
  for (int magnitude = 1; magnitude < 128; ++magnitude) {
    int exponent = 0;
    while (magnitude >> (exponent + 1)) ++exponent;
    const int bits = (127 + exponent) << 7 | ((magnitude << (7 - exponent)) & 0x7F);
    bytes.low[magnitude] = bits & 0xFF;
    bytes.high[magnitude] = bits >> 8;
  }
  return bytes;
}

inline constexpr MagnitudeBytes kMagnitudeBytes = magnitude_bytes();

// int8 weights are packed as sign and magnitude (pack_weight), so a value's bf16 is the magnitude's bf16,
// two bytes looked up in 128-entry tables (vpermi2b), with the sign bit ORed into the high byte: 5
// instructions per 64 values, where sign-extending, converting and rounding took 12.  The bytes are
// interleaved (low, high) within 128-bit lanes, which pack_weight's byte order undoes.
struct Int8Widening {
  __m512i low[2], high[2], sign;

  Int8Widening() {
    for (int half = 0; half < 2; ++half) {
      low[half] = _mm512_load_si512(kMagnitudeBytes.low + 64 * half);
      high[half] = _mm512_load_si512(kMagnitudeBytes.high + 64 * half);
    }
    sign = _mm512_set1_epi8(static_cast<char>(0x80));
  }

  void operator()(const int8_t* values, __m512bh& even, __m512bh& odd) const {
    const __m512i bytes = _mm512_loadu_si512(values);
    const __m512i low_byte = _mm512_permutex2var_epi8(low[0], bytes, low[1]);  // index bit 7 ignored
    const __m512i magnitude_high = _mm512_permutex2var_epi8(high[0], bytes, high[1]);
    const __m512i high_byte = _mm512_ternarylogic_epi32(magnitude_high, bytes, sign, 0xF8);  // a | (b & c)
    even = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi8(low_byte, high_byte));
    odd = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi8(low_byte, high_byte));
  }
};

template <typename W>
using PairLoading = std::conditional_t<std::is_same_v<W, int8_t>, Int8Widening, Bf16Loading>;

// The next item's weights, fetched into L2 a slice per step of a row tile's loop over this item's.
struct NextItem {
  const char* bytes;  // nullptr: none
  int64_t slice;      // bytes per step, a multiple of the cache line
};

// acc[r][p] += the products of input pairs k and k + 1 of M rows and the item's panels; fetches a slice of
// `next` on the way.
template <int M, int PANELS, typename W>
inline void accumulate_step(__m512 (&acc)[M][PANELS], const int32_t* x_pairs, int64_t pairs, const W* panels,
                            int64_t k, const PairLoading<W>& load, NextItem next) {
  const int64_t panel_stride = pairs * 2 * kPanel;
  if (next.bytes != nullptr)
    for (int64_t line = 0; line < next.slice; line += 64)
      _mm_prefetch(next.bytes + k / 2 * next.slice + line, _MM_HINT_T1);
  __m512bh even[PANELS], odd[PANELS];
  for (int p = 0; p < PANELS; ++p) load(panels + p * panel_stride + k * 2 * kPanel, even[p], odd[p]);
  for (int r = 0; r < M; ++r) {
    const __m512bh even_x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(x_pairs[r * pairs + k]));
    const __m512bh odd_x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(x_pairs[r * pairs + k + 1]));
    for (int p = 0; p < PANELS; ++p) {
      acc[r][p] = _mm512_dpbf16_ps(acc[r][p], even_x, even[p]);
      acc[r][p] = _mm512_dpbf16_ps(acc[r][p], odd_x, odd[p]);
    }
  }
}

template <int M, int PANELS>
inline void set_zero(__m512 (&acc)[M][PANELS]) {
  for (int r = 0; r < M; ++r)
    for (int p = 0; p < PANELS; ++p) acc[r][p] = _mm512_setzero_ps();
}

// out[r][column:column + 16 * PANELS] for M rows, over the item's packed panels.
//
// SPLIT (int8 weights) sums each column in two chains, the loop's even steps and its odd ones (a step: two
// input pairs), added at the end; bf16 sums in one.  A chain is a run of dependent pair dot products (~6
// cycles each on Zen 4); one row has one chain per panel, and that latency, not memory, bound int8, which
// packs a step into 16 bytes a column where bf16 takes 32: one layer's int8 weights from L2 went through at
// 32 GB/s on two cores (bf16: 63), about what memory delivers, and at 56 with two chains.  Where rows times
// panels is at most 8 (up to 4 rows of two panels), the chains run side by side in at most 16 accumulators;
// larger tiles would need more registers than there are, and have chains enough anyway, so they take the even
// steps, then the odd ones, from cache.  Every row count sums alike, so a column's sum does not depend on the
// batch.
template <int M, int PANELS, bool SPLIT, typename W>
void tile(const c10::BFloat16* x, const W* panels, const float* bias, const float* scale, c10::BFloat16* out,
          int64_t in, int64_t out_features, int64_t column, NextItem next) {
  const int64_t pairs = in / 2;
  const int32_t* x_pairs = reinterpret_cast<const int32_t*>(x);
  const PairLoading<W> load;
  __m512 acc[M][PANELS], first[M][PANELS];
  set_zero(acc);
  if constexpr (SPLIT && M * PANELS <= 8) {
    set_zero(first);
    for (int64_t k = 0; k < pairs; k += 4) {
      accumulate_step(first, x_pairs, pairs, panels, k, load, next);
      if (k + 2 < pairs) accumulate_step(acc, x_pairs, pairs, panels, k + 2, load, next);
    }
  } else {
    for (int64_t k = 0; k < pairs; k += SPLIT ? 4 : 2)
      accumulate_step(acc, x_pairs, pairs, panels, k, load, next);
    if constexpr (SPLIT) {
      std::copy(&acc[0][0], &acc[0][0] + M * PANELS, &first[0][0]);
      set_zero(acc);
      for (int64_t k = 2; k < pairs; k += 4) accumulate_step(acc, x_pairs, pairs, panels, k, load, next);
    }
  }
  for (int p = 0; p < PANELS; ++p) {
    const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias + column + p * kPanel) : _mm512_setzero_ps();
    const __m512 s = scale != nullptr ? _mm512_loadu_ps(scale + column + p * kPanel) : _mm512_set1_ps(1);
    for (int r = 0; r < M; ++r) {
      const __m512 sum = SPLIT ? _mm512_add_ps(first[r][p], acc[r][p]) : acc[r][p];
      const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_mul_ps(sum, s), b));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * out_features + column + p * kPanel),
                          reinterpret_cast<__m256i>(rounded));
    }
  }
}

// An item's packed int8 weights (its panels' values, contiguous) as bf16, in the same order.
void widen(const int8_t* weights, int64_t values, c10::BFloat16* widened) {
  const Int8Widening load;
  for (int64_t i = 0; i < values; i += 64) {
    __m512bh even, odd;
    load(weights + i, even, odd);
    _mm512_storeu_si512(widened + i, reinterpret_cast<__m512i>(even));
    _mm512_storeu_si512(widened + i + 32, reinterpret_cast<__m512i>(odd));
  }
}

// out[r:r + M] for every group of M rows of x, over one item's panels; the first group fetches `next`.
template <int PANELS, bool SPLIT, typename W>
void row_tiles(const c10::BFloat16* x, int64_t rows, int64_t in, const W* panels, const float* bias,
               const float* scale, c10::BFloat16* out, int64_t out_features, int64_t column, NextItem next) {
  for (int64_t r = 0; r < rows; r += kRowTile) {
    with_constant<kRowTile>(rows - r, [&](auto m) {
      tile<decltype(m)::value, PANELS, SPLIT>(x + r * in, panels, bias, scale, out + r * out_features, in, out_features, column,
                                       r == 0 ? next : NextItem{nullptr, 0});
    });
  }
}

// From how many rows a row tile fetches the next item's weights while it computes with this one's.  The
// hardware prefetchers alone run too few lines ahead once the arithmetic slows the loop down, and the
// weights' reads then add to the arithmetic instead of hiding behind it: SmolLM2's products (lm_head
// included) at 7 rows took 8.9-10.5 ms without and 6.7-7.7 with, 8 rows 9.5 -> 7.3, 16 rows 14.8-17.2 ->
// 12.1-13.3, 32 rows 24.8-27.4 -> 22.3-24.7; int8 at 2 rows 6.4 -> 4.9, 7 rows 7.5 -> 6.0.  Where the loop
// keeps up with memory the fetches only take load slots: bf16 at 1 row 5.6 -> 6.7 ms, 2 rows 6.9 -> 7.3.
template <typename W>
constexpr int64_t kPrefetchRows = std::is_same_v<W, int8_t> ? 2 : 3;

// Every row of x through the items [begin, end) of PANELS panels.  int8 weights are widened in registers
// while one row tile passes over them, else once per item into a buffer the row tiles then share.
template <int PANELS, typename W>
void vector_items(const c10::BFloat16* x, int64_t rows, int64_t in, const W* weights, const float* bias,
                  const float* scale, c10::BFloat16* out, int64_t out_features, int64_t begin, int64_t end) {
  constexpr int64_t kItemColumns = PANELS * kPanel;  // a panel of 16 columns holds 16 * in values
  const bool widen_once = std::is_same_v<W, int8_t> && rows > kRowTile;
  // Uninitialized: widen() writes it whole before it is read.
  const std::unique_ptr<c10::BFloat16[]> widened(widen_once ? new c10::BFloat16[kItemColumns * in] : nullptr);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t column = item * kItemColumns;
    const W* panels = weights + column * in;
    const bool fetch = rows >= kPrefetchRows<W> && item + 1 < end;
    const NextItem next{fetch ? reinterpret_cast<const char*>(panels + kItemColumns * in) : nullptr,
                        kItemColumns * 4 * static_cast<int64_t>(sizeof(W))};  // the loop takes in / 4 steps
    if constexpr (std::is_same_v<W, int8_t>) {
      if (widen_once) {
        widen(panels, kItemColumns * in, widened.get());
        row_tiles<PANELS, true>(x, rows, in, widened.get(), bias, scale, out, out_features, column, next);
        continue;
      }
    }
    row_tiles<PANELS, std::is_same_v<W, int8_t>>(x, rows, in, panels, bias, scale, out, out_features, column, next);
  }
}

// One row reads an item's weights once, so a narrower item costs nothing in reuse, and one stream of
// weights per thread instead of two reads them faster: SmolLM2's 30 int8 layers at one row took
// 3.3-3.9 ms against 4.1-4.7 with two panels in a standalone test (in the engine, 3.7-3.9 ms against the
// few-row kernel's 3.9-4.2); bf16 did not change.  At 2-8 rows one panel was slower (5 int8 rows: 9.3 ms
// against 8.1), so more rows keep two.
template <typename W>
void vector_linear(const c10::BFloat16* x, int64_t rows, int64_t in, const W* weights, const float* bias,
                   const float* scale, c10::BFloat16* out, int64_t out_features) {
  const auto run = [&](auto panels) {
    constexpr int kItemPanels = decltype(panels)::value;
    at::parallel_for(0, out_features / (kItemPanels * kPanel), 1, [&](int64_t begin, int64_t end) {
      vector_items<kItemPanels>(x, rows, in, weights, bias, scale, out, out_features, begin, end);
    });
  };
  if (rows == 1) return run(std::integral_constant<int, 1>{});
  run(std::integral_constant<int, kPanels>{});
}

}  // namespace
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
namespace {

// An A tile holds 16 rows of x by 32 inputs; a B tile 16 input pairs of one panel, which is exactly the
// packed layout's next 1 KB (16 pairs x 16 columns x 2).  Each sum of C depends on its row of A alone
// (amx.h), so a decode step's rows do not depend on the batch, and a drafted step's rows equal the plain
// step's.  Tiles 0-3: C for (row tile, panel) 00, 01, 10, 11; 4-5: A for row tiles 0 and 1; 6-7: B for
// panels 0, 1.
constexpr int64_t kBlockRows = 2 * kTileRows;  // rows per pass over an item's weights: 4 C tiles

// sums (kBlockRows, 2 * kPanel) = x rows [0, kBlockRows) . the item's two panels; x has that many rows
// (padded), or kTileRows where `one_tile`.
void amx_block(const c10::BFloat16* x, int64_t in, const c10::BFloat16* panels, bool one_tile, float* sums) {
  const int64_t panel_stride = in * kPanel, x_stride = in * 2;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < in; k += kTileInputs) {
    _tile_loadd(6, panels + k * kPanel, 64);
    _tile_loadd(7, panels + panel_stride + k * kPanel, 64);
    _tile_loadd(4, x + k, x_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (one_tile) continue;
    _tile_loadd(5, x + kTileRows * in + k, x_stride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  constexpr int64_t stride = 2 * kPanel * sizeof(float);
  _tile_stored(0, sums, stride);
  _tile_stored(1, sums + kPanel, stride);
  if (one_tile) return;
  _tile_stored(2, sums + kTileRows * 2 * kPanel, stride);
  _tile_stored(3, sums + kTileRows * 2 * kPanel + kPanel, stride);
}

// out[0:rows][column:column + 2 * kPanel] = sums + bias, rounded to bf16 as the vector path rounds.
void store_rows(const float* sums, int64_t rows, const float* bias, c10::BFloat16* out, int64_t out_features,
                int64_t column) {
  for (int p = 0; p < kPanels; ++p) {
    const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias + column + p * kPanel) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 sum = _mm512_loadu_ps(sums + r * 2 * kPanel + p * kPanel);
      const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_add_ps(sum, b));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * out_features + column + p * kPanel),
                          reinterpret_cast<__m256i>(rounded));
    }
  }
}

void amx_linear(const c10::BFloat16* x, int64_t rows, int64_t in, const c10::BFloat16* weights, const float* bias,
                c10::BFloat16* out, int64_t out_features) {
  at::parallel_for(0, out_features / (kPanels * kPanel), 1, [&](int64_t begin, int64_t end) {
    configure_tiles();
    alignas(64) float sums[kBlockRows * 2 * kPanel];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t column = item * kPanels * kPanel;
      for (int64_t r = 0; r < rows; r += kBlockRows) {
        const int64_t count = std::min(kBlockRows, rows - r);
        amx_block(x + r * in, in, weights + column * in, count <= kTileRows, sums);
        store_rows(sums, count, bias, out + r * out_features, out_features, column);
      }
    }
    release_tiles();
  });
}

}  // namespace
#endif

bool packed_linear_available() {
#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
  return true;
#else
  return false;
#endif
}

bool packed_linear_on_amx(int64_t in) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  return in % kTileInputs == 0 && amx_permitted();
#else
  (void)in;
  return false;
#endif
}

int64_t packed_linear_rows_per_pass(int64_t in) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (packed_linear_on_amx(in)) return kBlockRows;
#endif
  (void)in;
  return kRowTile;
}

torch::Tensor pack_weight(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && (weight.scalar_type() == torch::kBFloat16 || weight.scalar_type() == torch::kChar),
              "weight: (out, in) bf16 or int8");
  const int64_t out = weight.size(0), in = weight.size(1);
  TORCH_CHECK(out % (kPanels * kPanel) == 0 && in % 4 == 0,
              "packing needs out a multiple of 32 and in a multiple of 4");
  // (out, in) -> (out / 16, 16, in / 2, 2) -> (out / 16, in / 2, 16, 2)
  const auto packed = weight.reshape({out / kPanel, kPanel, in / 2, 2}).permute({0, 2, 1, 3});
  if (weight.scalar_type() == torch::kBFloat16) return packed.contiguous();
  // int8 as Int8Widening reads it: sign and magnitude, and in each 64 values (two input pairs) the bytes
  // of 128-bit lane L are values 8L..8L+7 of the first pair, then the same of the second.
  TORCH_CHECK(weight.min().item<int8_t>() > -128, "int8 weights in [-127, 127] (quantize_int8)");
  const auto wide = packed.to(torch::kShort);
  const auto sign_and_magnitude = torch::where(wide < 0, wide.neg().bitwise_or(0x80), wide).to(torch::kChar);
  return sign_and_magnitude.reshape({out / kPanel, in / 4, 2, 4, 8})
      .permute({0, 1, 3, 2, 4})
      .contiguous()
      .reshape({out / kPanel, in / 2, kPanel, 2});
}

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor packed, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> scale) {
#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16, "x: (rows, in) bf16");
  TORCH_CHECK(packed.dim() == 4 && packed.size(1) * 2 == x.size(1) && packed.is_contiguous(),
              "packed: (out / 16, in / 2, 16, 2) from pack_weight");
  const bool quantized = packed.scalar_type() == torch::kChar;
  TORCH_CHECK(quantized == scale.has_value(), "int8 weights need a scale per output channel, others none");
  x = x.contiguous();
  const int64_t rows = x.size(0), in = x.size(1), out_features = packed.size(0) * kPanel;
  const auto bias_float = as_float(bias), scale_float = as_float(scale);
  TORCH_CHECK(!quantized || scale_float->numel() == out_features, "one scale per output channel");
  const float *bias_data = data_or_null(bias_float), *scale_data = data_or_null(scale_float);
  auto out = torch::empty({rows, out_features}, x.options());
  auto* out_data = out.data_ptr<c10::BFloat16>();
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (!quantized && packed_linear_on_amx(in)) {
    // A tiles read whole tiles of rows: pad x to them (the padding's sums are dropped).
    const int64_t padded = (rows + kTileRows - 1) / kTileRows * kTileRows;
    if (padded != rows) x = torch::cat({x, x.new_zeros({padded - rows, in})});
    amx_linear(x.data_ptr<c10::BFloat16>(), rows, in, packed.data_ptr<c10::BFloat16>(), bias_data, out_data,
               out_features);
    return out;
  }
#endif
  packed_linear_rows(x.data_ptr<c10::BFloat16>(), rows, packed, bias_data, scale_data, out_data);
  return out;
#else
  TORCH_CHECK(false, "packed_linear needs a CPU with AVX-512 BF16 and VBMI");
#endif
}

void packed_linear_rows(const c10::BFloat16* x, int64_t rows, const torch::Tensor& packed, const float* bias,
                        const float* scale, c10::BFloat16* out) {
#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
  const int64_t in = packed.size(1) * 2, out_features = packed.size(0) * kPanel;
  const void* weights = packed.data_ptr();  // data_ptr<T> would check the dtype again, per product
  if (packed.scalar_type() == torch::kChar) {
    vector_linear(x, rows, in, static_cast<const int8_t*>(weights), bias, scale, out, out_features);
  } else {
    vector_linear(x, rows, in, static_cast<const c10::BFloat16*>(weights), bias, nullptr, out, out_features);
  }
#else
  TORCH_CHECK(false, "packed_linear needs a CPU with AVX-512 BF16 and VBMI");
#endif
}

}  // namespace kvchat
