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
// accumulation is in float32.
#include <ATen/Parallel.h>

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

// A finished dot product (`sum` over the first `done` terms): the tail past whole vectors, then the
// weight row's scale and the bias.
template <typename T, typename W>
inline void store(float sum, const float* x_row, const W* weight_row, int64_t done, int64_t in, const float* bias,
                  const float* scale, int64_t column, T* out_row) {
  for (int64_t k = done; k < in; ++k) sum += x_row[k] * static_cast<float>(weight_row[k]);
  if (scale != nullptr) sum *= scale[column];
  if (bias != nullptr) sum += bias[column];
  out_row[column] = static_cast<T>(sum);
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

template <typename T, typename W>
void linear(const float* x, const W* weight, const float* bias, const float* scale, T* out, int64_t rows,
            int64_t in, int64_t out_features) {
  constexpr int kPass = rows_per_pass<W>();
  const int64_t items = (out_features + kColumns - 1) / kColumns;
  at::parallel_for(0, items, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t column = item * kColumns, count = std::min(kColumns, out_features - column);
      for (int64_t r = 0; r < rows; r += kPass) {
        with_constant<kPass>(rows - r, [&](auto pass) {
          columns<T, W, decltype(pass)::value>(x + r * in, weight, bias, scale, out + r * out_features, in,
                                               out_features, column, count, r == 0);
        });
      }
    }
  });
}

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
