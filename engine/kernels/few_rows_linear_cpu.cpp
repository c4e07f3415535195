// x @ weight.T + bias for the few rows of a decode step, for the CPU.
//
// With one to a few dozen rows, a linear layer is bound by reading its weights from memory.  torch's
// general matrix product reads them at half the machine's bandwidth for one row, and slower still for
// two to eight, where every decode step of a small batch lands.  Here each weight row is read once per
// step and multiplied with all of x's rows while it sits in registers: x's rows stay in L1, weight rows
// stream from memory, and torch's threads split the output columns.
//
// x (rows, in) and weight (out, in), contiguous: the same dtype, or int8 weights with a float32 scale per
// output channel (engine/quantization.py), applied to each finished dot product.  x is converted to
// float32 once per call, bf16 and int8 weights are widened in registers (load_pair in simd.h), and
// accumulation is in float32; except for int8 weights with 16-bit x on AVX2, which multiply in integers
// (int16_linear below).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "float_args.h"
#include "kernels.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int64_t kColumns = 16;  // output columns per work item: a multiple of every TILE below

// How far ahead of the loop the weights' cache lines are requested.  They stream in address order, yet on
// the AVX2 kind (Zen 1) the hardware prefetchers fall behind loops slower than memory: SmolLM2's products
// at one row, weights on huge pages as the engine holds them, took 15.8 ms in bf16 and 14.0 in int8
// without these requests, 14.0 and 13.0 with them; float32, whose loop keeps up, did not change.
constexpr int64_t kPrefetchBytes = 4096, kCacheLine = 64;

// A finished dot product: the weight row's scale and the bias.
template <typename T>
inline void finish(float sum, const float* bias, const float* scale, int64_t column, T* out_row) {
  if (scale != nullptr) sum *= scale[column];
  if (bias != nullptr) sum += bias[column];
  out_row[column] = static_cast<T>(sum);
}

// A dot product finished after whole vectors (`sum` over the first `done` terms): the tail, then finish.
template <typename T, typename W>
inline void store(float sum, const float* x_row, const W* weight_row, int64_t done, int64_t in, const float* bias,
                  const float* scale, int64_t column, T* out_row) {
  for (int64_t k = done; k < in; ++k) sum += x_row[k] * static_cast<float>(weight_row[k]);
  finish(sum, bias, scale, column, out_row);
}

// Dot products of ROWS rows of x with the weight row `column`.  x is in float32, each run of 2 * kLanes
// values in load_pair's order for W (paired_rows), so only the weights are converted.  Two accumulators per
// dot product, whatever ROWS: one chain of FMAs would not hide its latency at one row, and a row's sum must
// not depend on how many rows come with it (AttentionMetadata.kernel_rows).  `streamed`: the first pass
// over these weight rows, which come from memory; later passes find them in cache, and prefetching there
// too cost bf16 4 % at 32 rows.
template <typename T, typename W, int ROWS>
void tile(const float* x, const W* weight, const float* bias, const float* scale, T* out, int64_t in,
          int64_t out_features, int64_t column, bool streamed) {
  vfloat acc[ROWS][2] = {};
  const W* weight_row = weight + column * in;
  int64_t k = 0;
  for (; k + 2 * kLanes <= in; k += 2 * kLanes) {
    if (streamed && k * sizeof(W) % kCacheLine == 0) __builtin_prefetch(weight_row + k + kPrefetchBytes / sizeof(W));
    vfloat w[2];
    load_pair(weight_row + k, w[0], w[1]);
    for (int r = 0; r < ROWS; ++r) {
      vfloat xs[2];
      load_pair(x + r * in + k, xs[0], xs[1]);
      acc[r][0] += xs[0] * w[0];
      acc[r][1] += xs[1] * w[1];
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    const float sum = horizontal_sum(acc[r][0] + acc[r][1]);
    store(sum, x + r * in, weight_row, k, in, bias, scale, column, out + r * out_features);
  }
}

#ifdef __AVX512F__
// int8 weights where the CPU has AVX-512: sixteen weights widened per pair of instructions.  With eight
// (the AVX2 path above) the widening, not memory, bounds a decode step's few rows (SmolLM2 at batch 1:
// see the README's INT8 section).  x is in float32 in order, as for float weights.
template <typename T, int ROWS, int TILE>
void tile_int8(const float* x, const int8_t* weight, const float* bias, const float* scale, T* out, int64_t in,
               int64_t out_features, int64_t column) {
  __m512 acc[ROWS][TILE][2];
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TILE; ++t) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= in; k += 32) {
    __m512 xs[ROWS][2];
    for (int r = 0; r < ROWS; ++r) {
      xs[r][0] = _mm512_loadu_ps(x + r * in + k);
      xs[r][1] = _mm512_loadu_ps(x + r * in + k + 16);
    }
    for (int t = 0; t < TILE; ++t) {
      const int8_t* row = weight + (column + t) * in + k;
      for (int half = 0; half < 2; ++half) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * half));
        const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
        for (int r = 0; r < ROWS; ++r) acc[r][t][half] = _mm512_fmadd_ps(xs[r][half], w, acc[r][t][half]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int t = 0; t < TILE; ++t) {
      const float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][t][0], acc[r][t][1]));
      store(sum, x + r * in, weight + (column + t) * in, k, in, bias, scale, column + t, out + r * out_features);
    }
  }
}
#endif

// ROWS rows of x against `count` weight rows from `column`, one weight row at a time, in address order,
// which the hardware prefetchers follow best (all of SmolLM2's bf16 layers at one row: 10-11 ms, against
// 16 ms reading 8 weight rows side by side).  int8 weights on AVX-512, with 32 registers, take two weight
// rows at a time for four rows of x.
template <typename T, typename W, int ROWS>
void columns(const float* x, const W* weight, const float* bias, const float* scale, T* out, int64_t in,
             int64_t out_features, int64_t column, int64_t count, bool streamed) {
  int64_t c = 0;
#ifdef __AVX512F__
  if constexpr (std::is_same_v<W, int8_t>) {
    constexpr int TILE = ROWS < 4 ? 1 : 2;
    for (; c + TILE <= count; c += TILE)
      tile_int8<T, ROWS, TILE>(x, weight, bias, scale, out, in, out_features, column + c);
    for (; c < count; ++c) tile_int8<T, ROWS, 1>(x, weight, bias, scale, out, in, out_features, column + c);
    return;
  }
#endif
  for (; c < count; ++c) tile<T, W, ROWS>(x, weight, bias, scale, out, in, out_features, column + c, streamed);
}

// x (of type T) in float32, each whole run of 2 * kLanes values in the order load_pair reads the weights
// (of type W) in: floats as they are, bf16 as even and odd values, int8 in order (its widening keeps the
// order), here by our loop, where torch's conversion cost ~3 us a call (a decode step makes ~180).
template <typename T, typename W>
torch::Tensor paired_rows(const torch::Tensor& x) {
  if constexpr (std::is_same_v<T, float>) return x;
  auto paired = torch::empty(x.sizes(), x.options().dtype(torch::kFloat));
  const T* source = x.data_ptr<T>();
  float* target = paired.data_ptr<float>();
  const int64_t rows = x.size(0), in = x.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t k = 0;
    for (; k + 2 * kLanes <= in; k += 2 * kLanes) {
      vfloat first, second;
      if constexpr (std::is_same_v<W, int8_t>) {
        first = load_lanes(source + r * in + k);
        second = load_lanes(source + r * in + k + kLanes);
      } else {
        load_pair(source + r * in + k, first, second);
      }
      std::memcpy(target + r * in + k, &first, sizeof(first));
      std::memcpy(target + r * in + k + kLanes, &second, sizeof(second));
    }
    for (; k < in; ++k) target[r * in + k] = static_cast<float>(source[r * in + k]);
  }
  return paired;
}

// Rows of x per pass over a work item's weight rows, which stay in L1/L2 while every pass goes over them.
// A weight vector loaded serves one FMA per row of the pass, an x vector one, so the more rows a pass
// takes, the fewer loads per FMA; six rows' sums (two accumulators each) and a weight pair fill AVX2's 16
// vector registers.  On the AVX2 kind SmolLM2's products took 5-9 % less than with four rows a pass at 16
// and 32 rows, 22 % less at 5 (bf16 and int8); seven rows were no better, eight slower.  AVX-512's int8
// tiles (two columns, four rows) keep four.
template <typename W>
constexpr int rows_per_pass() {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<W, int8_t>) return 4;
#endif
  return 6;
}

// Splits the output columns into work items for torch's threads, and each item's rows into passes of up
// to PASS: run(first row, rows of the pass as a constant, first column, columns, whether the pass is the
// item's first, which reads its weights from memory).
template <int PASS, typename Run>
void for_each_pass(int64_t rows, int64_t out_features, Run run) {
  const int64_t items = (out_features + kColumns - 1) / kColumns;
  at::parallel_for(0, items, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t column = item * kColumns, count = std::min(kColumns, out_features - column);
      for (int64_t r = 0; r < rows; r += PASS)
        with_constant<PASS>(rows - r, [&](auto pass) { run(r, pass, column, count, r == 0); });
    }
  });
}

template <typename T, typename W>
void linear(const float* x, const W* weight, const float* bias, const float* scale, T* out, int64_t rows,
            int64_t in, int64_t out_features) {
  for_each_pass<rows_per_pass<W>()>(rows, out_features, [&](int64_t r, auto pass, int64_t column, int64_t count,
                                                             bool streamed) {
    columns<T, W, decltype(pass)::value>(x + r * in, weight, bias, scale, out + r * out_features, in,
                                         out_features, column, count, streamed);
  });
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// int8 weights with bf16 or float16 x, where the CPU has AVX2 and not AVX-512: integer products.  Widening
// int8 weights to float32 for FMAs ran ~7-9 G weights a second on a Zen 1 core, below what memory delivers;
// pmaddwd multiplies eight int16 pairs and adds neighbours in one 128-bit instruction, 18.5 G in a loop over
// weights in L2 (256-bit: 15; Zen 1 splits those in two).  So x is held in int16 with a power-of-two scale
// per block of kBlock values: a bf16 value is exact there unless it is 2^8 times smaller than its block's
// largest (float16: 2^5), and then rounds by at most 2^-16 of that largest.  That stays below what the
// int8 weights' own rounding (up to 2^-8 of a row's largest weight) moves a product unless a block's
// largest value is ~1,000 times its typical one.  A block's sum is exact in int32 (|x| <= 2^15, |weight| <=
// 127, 256 products: below 2^30), then added in float32 times the block's scale.  Blocks of
// 128 values ran one-row products 20 % slower (their ends cost as much as their sums), 512 no faster.
constexpr int64_t kBlock = 256;
// Rows of x per pass over a work item's weights, as rows_per_pass: six rows' sums (an int32 chain and a
// float32 sum each) and the operands fill the 16 registers.
constexpr int kInt16Pass = 6;

// x in int16, each pass's rows interleaved in groups of eight values (row i's group g of a pass of n rows
// at g * n * 8 + i * 8, zeros past `in`), so that one pointer with constant offsets reaches every row of
// a pass: with a pointer per row, six rows spilled the general registers (12.7 G products a second on a
// Zen 1 core against 15.7), slower than widening the weights to float.
struct Int16Rows {
  std::vector<int16_t> values;  // rows * groups * 8
  std::vector<float> scales;    // (rows, blocks): a value of block b stands for value * scales[b]
  int64_t rows = 0, groups = 0, blocks = 0;  // groups of eight values a row: `in` rounded up
};

inline vfloat absolute(vfloat v) { return (vfloat)((vword)v & 0x7fffffffu); }

// Up to kLanes values of x from `source`, the rest zero.
template <typename T>
inline vfloat load_some(const T* source, int64_t count) {
  if (count == kLanes) return load_lanes(source);
  T values[kLanes] = {};
  std::copy(source, source + count, values);
  return load_lanes(values);
}

// Eight values times `factor`, rounded to the nearest (even) int16: cvtps2dq, then a saturating pack, so no
// float, not even NaN, converts out of range.
inline void round_group(vfloat scaled, int16_t* target) {
  __m256 lanes;
  std::memcpy(&lanes, &scaled, sizeof(lanes));
  const __m256i words = _mm256_cvtps_epi32(lanes);
  const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(target), packed);
}

// One row of x: each block's power-of-two scale into `scales`, its values into the row's groups, which lie
// `stride` int16 apart.
template <typename T>
void round_row(const T* source, int64_t in, float* scales, int16_t* target, int64_t stride) {
  for (int64_t begin = 0; begin < in; begin += kBlock) {
    const int64_t count = std::min(kBlock, in - begin);
    vfloat largest = {};
    for (int64_t k = 0; k < count; k += kLanes) {
      const vfloat v = absolute(load_some(source + begin + k, std::min(kLanes, count - k)));
      largest = v > largest ? v : largest;
    }
    int exponent = 0;
    std::frexp(horizontal_max(largest), &exponent);  // the block's values < 2^exponent, so < 2^15 after
    scales[begin / kBlock] = std::ldexp(1.0f, exponent - 15);
    const float factor = std::ldexp(1.0f, 15 - exponent);
    for (int64_t k = 0; k < count; k += kLanes)
      round_group(load_some(source + begin + k, std::min(kLanes, count - k)) * factor,
                  target + (begin + k) / kLanes * stride);
  }
}

// x's int16 form in buffers the calling thread reuses: a decode step makes ~120 calls, and two tensors
// allocated for each cost ~1 us a call.
template <typename T>
const Int16Rows& int16_rows(const torch::Tensor& x) {
  thread_local Int16Rows held;
  const int64_t rows = x.size(0), in = x.size(1);
  held.rows = rows, held.groups = (in + kLanes - 1) / kLanes, held.blocks = (in + kBlock - 1) / kBlock;
  held.values.resize(rows * held.groups * kLanes);
  held.scales.resize(rows * held.blocks);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = r / kInt16Pass * kInt16Pass, pass_rows = std::min<int64_t>(kInt16Pass, rows - first);
    int16_t* row = held.values.data() + first * held.groups * kLanes + (r - first) * kLanes;
    round_row(x.data_ptr<T>() + r * in, in, held.scales.data() + r * held.blocks, row, pass_rows * kLanes);
  }
  return held;
}

// The exact sum of each of COLS int32 vectors' four lanes, vector c's in lane c (lanes past COLS: unused).
template <int COLS>
inline __m128i column_sums(const __m128i (&chains)[COLS]) {
  if constexpr (COLS == 4)
    return _mm_hadd_epi32(_mm_hadd_epi32(chains[0], chains[1]), _mm_hadd_epi32(chains[2], chains[3]));
  else if constexpr (COLS == 2) {
    const __m128i pairs = _mm_hadd_epi32(chains[0], chains[1]);
    return _mm_hadd_epi32(pairs, pairs);
  } else {
    const __m128i pairs = _mm_hadd_epi32(chains[0], chains[0]);
    return _mm_hadd_epi32(pairs, pairs);
  }
}

// Eight int8 weights from `row`, sign-extended to int16.
inline __m128i weight_group(const int8_t* row) {
  return _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
}

// Each row's chains plus the products of its eight x values (`groups`, Int16Rows' layout) with each column's
// eight weights.
template <int ROWS, int COLS>
inline void accumulate(__m128i (&chains)[ROWS][COLS], const int16_t* groups, const __m128i (&w)[COLS]) {
  for (int r = 0; r < ROWS; ++r) {
    const __m128i xs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(groups + r * kLanes));
    for (int c = 0; c < COLS; ++c) chains[r][c] = _mm_add_epi32(chains[r][c], _mm_madd_epi16(w[c], xs));
  }
}

// Dot products of a pass's ROWS rows of x (Int16Rows' layout, from `x`) with COLS weight rows from
// `column`, block by block: one int32 chain per row and column, whose exact block sum (column c's in lane c)
// is added in float32 times the block's scale, so every dot product takes the same float steps whatever ROWS
// and COLS.  (This loop in a function of its own, even inlined, ran one-row products 5 % slower.)
template <typename T, int ROWS, int COLS>
void tile_int16(const int16_t* x, const float* x_scales, const int8_t* weight, const float* bias,
                const float* scale, T* out, int64_t in, int64_t out_features, int64_t column, bool streamed) {
  const int64_t blocks = (in + kBlock - 1) / kBlock;
  const int8_t* rows_of_weight = weight + column * in;
  __m128 sums[ROWS];
  for (int r = 0; r < ROWS; ++r) sums[r] = _mm_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(in, (b + 1) * kBlock);
    __m128i chains[ROWS][COLS];
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < COLS; ++c) chains[r][c] = _mm_setzero_si128();
    const int64_t whole = std::min(end, in / kLanes * kLanes);
    __m128i w[COLS];
    int64_t k = b * kBlock;
    // Two groups a step: one a step ran one-row products ~20 % slower.  The COLS weight rows, one after
    // another, are read at one pace: as a single stream COLS times as fast, a line every 64 / (16 * COLS) steps.
    for (; k + 2 * kLanes <= whole; k += 2 * kLanes) {
      if (streamed && (COLS >= 4 || k * COLS % kCacheLine == 0))
        __builtin_prefetch(rows_of_weight + k * COLS + kPrefetchBytes);
      for (int g = 0; g < 2; ++g) {
        for (int c = 0; c < COLS; ++c) w[c] = weight_group(rows_of_weight + c * in + k + g * kLanes);
        accumulate<ROWS, COLS>(chains, x + (k + g * kLanes) * ROWS, w);
      }
    }
    for (; k < whole; k += kLanes) {
      for (int c = 0; c < COLS; ++c) w[c] = weight_group(rows_of_weight + c * in + k);
      accumulate<ROWS, COLS>(chains, x + k * ROWS, w);
    }
    if (k < end) {  // the row's last values, fewer than eight (x is zero past them)
      for (int c = 0; c < COLS; ++c) {
        int8_t last[kLanes] = {};
        std::copy(rows_of_weight + c * in + k, rows_of_weight + c * in + end, last);
        w[c] = weight_group(last);
      }
      accumulate<ROWS, COLS>(chains, x + k * ROWS, w);
    }
    for (int r = 0; r < ROWS; ++r) {
      const __m128 block_scale = _mm_set1_ps(x_scales[r * blocks + b]);
      sums[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(column_sums<COLS>(chains[r])), block_scale, sums[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    float lanes[4];
    _mm_storeu_ps(lanes, sums[r]);
    for (int c = 0; c < COLS; ++c) finish(lanes[c], bias, scale, column + c, out + r * out_features);
  }
}

// Columns a tile takes at once: at one row, four share x's loads and the block ends; at two or three, two
// keep four to six chains going (pmaddwd's latency); from four rows, the rows do.
template <int ROWS>
constexpr int int16_columns() { return ROWS == 1 ? 4 : ROWS < 4 ? 2 : 1; }

template <typename T>
void int16_linear(const Int16Rows& x, const int8_t* weight, const float* bias, const float* scale, T* out,
                  int64_t in, int64_t out_features) {
  for_each_pass<kInt16Pass>(x.rows, out_features, [&](int64_t r, auto pass, int64_t column, int64_t count,
                                                    bool streamed) {
    constexpr int ROWS = decltype(pass)::value, COLS = int16_columns<ROWS>();
    const int16_t* rows = x.values.data() + r * x.groups * kLanes;
    const float* scales = x.scales.data() + r * x.blocks;
    int64_t c = 0;
    for (; c + COLS <= count; c += COLS)
      tile_int16<T, ROWS, COLS>(rows, scales, weight, bias, scale, out + r * out_features, in, out_features,
                                column + c, streamed);
    for (; c < count; ++c)
      tile_int16<T, ROWS, 1>(rows, scales, weight, bias, scale, out + r * out_features, in, out_features,
                             column + c, streamed);
  });
}
#endif

}  // namespace

torch::Tensor few_rows_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                              std::optional<torch::Tensor> scale) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x (rows, in), weight (out, in)");
  const bool quantized = weight.scalar_type() == torch::kChar;
  TORCH_CHECK(quantized || x.scalar_type() == weight.scalar_type(), "x and weight must have the same dtype");
  TORCH_CHECK(quantized == scale.has_value(), "int8 weights need a scale per output channel, others none");
  TORCH_CHECK(!quantized || scale->numel() == weight.size(0), "one scale per output channel");
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
  x = x.contiguous();
  const auto bias_float = as_float(bias), scale_float = as_float(scale);
  auto out = torch::empty({x.size(0), weight.size(0)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "few_rows_linear", [&] {
#if defined(__AVX2__) && !defined(__AVX512F__)
    if constexpr (sizeof(scalar_t) == 2) {
      if (quantized) {
        int16_linear<scalar_t>(int16_rows<scalar_t>(x), weight.data_ptr<int8_t>(), data_or_null(bias_float),
                               data_or_null(scale_float), out.data_ptr<scalar_t>(), x.size(1), weight.size(0));
        return;
      }
    }
#endif
    if (quantized) {
      const torch::Tensor paired = paired_rows<scalar_t, int8_t>(x);
      linear<scalar_t, int8_t>(paired.data_ptr<float>(), weight.data_ptr<int8_t>(), data_or_null(bias_float),
                               data_or_null(scale_float), out.data_ptr<scalar_t>(), x.size(0), x.size(1),
                               weight.size(0));
    } else {
      const torch::Tensor paired = paired_rows<scalar_t, scalar_t>(x);
      linear<scalar_t, scalar_t>(paired.data_ptr<float>(), weight.data_ptr<scalar_t>(), data_or_null(bias_float),
                                 nullptr, out.data_ptr<scalar_t>(), x.size(0), x.size(1), weight.size(0));
    }
  });
  return out;
}

}  // namespace kvchat
