// x @ weight.T + bias for the few rows of a decode step, for the CPU.
//
// With one to a few dozen rows, a linear layer is bound by reading its weights from memory.  torch's
// general matrix product reads them at half the machine's bandwidth for one row, and slower still for
// two to eight, where every decode step of a small batch lands.  Here each weight row is read once per
// step and multiplied with all of x's rows while it sits in registers: x's rows stay in L1, weight rows
// stream from memory, and torch's threads split the output columns.
//
// x (rows, in) and weight (out, in), contiguous, the same dtype; accumulation is in float32.
#include <ATen/Parallel.h>

#include "kernels.h"
#include "simd.h"

namespace kvchat {
namespace {

constexpr int64_t kColumns = 16;  // output columns per work item: a multiple of every TILE below

// Dot products of ROWS rows of x with TILE consecutive weight rows starting at `column`.
template <typename T, int ROWS, int TILE>
void tile(const T* x, const T* weight, const float* bias, T* out, int64_t in, int64_t out_features,
          int64_t column) {
  vfloat acc[ROWS][TILE] = {};
  int64_t k = 0;
  for (; k + kLanes <= in; k += kLanes) {
    vfloat xs[ROWS];
    for (int r = 0; r < ROWS; ++r) xs[r] = load_lanes(x + r * in + k);
    for (int t = 0; t < TILE; ++t) {
      const vfloat w = load_lanes(weight + (column + t) * in + k);
      for (int r = 0; r < ROWS; ++r) acc[r][t] += xs[r] * w;
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int t = 0; t < TILE; ++t) {
      float sum = horizontal_sum(acc[r][t]);
      for (int64_t tail = k; tail < in; ++tail)
        sum += static_cast<float>(x[r * in + tail]) * static_cast<float>(weight[(column + t) * in + tail]);
      if (bias != nullptr) sum += bias[column + t];
      out[r * out_features + column + t] = static_cast<T>(sum);
    }
  }
}

// ROWS rows of x against `count` weight rows from `column`: as many registers as AVX2 has to spare.
template <typename T, int ROWS>
void columns(const T* x, const T* weight, const float* bias, T* out, int64_t in, int64_t out_features,
             int64_t column, int64_t count) {
  constexpr int TILE = ROWS == 1 ? 8 : ROWS == 2 ? 4 : 2;
  int64_t c = 0;
  for (; c + TILE <= count; c += TILE) tile<T, ROWS, TILE>(x, weight, bias, out, in, out_features, column + c);
  for (; c < count; ++c) tile<T, ROWS, 1>(x, weight, bias, out, in, out_features, column + c);
}

template <typename T>
void linear(const T* x, const T* weight, const float* bias, T* out, int64_t rows, int64_t in,
            int64_t out_features) {
  const int64_t items = (out_features + kColumns - 1) / kColumns;
  at::parallel_for(0, items, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t column = item * kColumns, count = std::min(kColumns, out_features - column);
      // The item's weight rows stay in L1/L2 while every group of four rows of x passes over them.
      int64_t r = 0;
      for (; r + 4 <= rows; r += 4)
        columns<T, 4>(x + r * in, weight, bias, out + r * out_features, in, out_features, column, count);
      const T* x_rest = x + r * in;
      T* out_rest = out + r * out_features;
      switch (rows - r) {
        case 1: columns<T, 1>(x_rest, weight, bias, out_rest, in, out_features, column, count); break;
        case 2: columns<T, 2>(x_rest, weight, bias, out_rest, in, out_features, column, count); break;
        case 3: columns<T, 3>(x_rest, weight, bias, out_rest, in, out_features, column, count); break;
      }
    }
  });
}

}  // namespace

torch::Tensor few_rows_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x (rows, in), weight (out, in)");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "x and weight must have the same dtype");
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
  x = x.contiguous();
  torch::Tensor bias_float;
  if (bias.has_value()) bias_float = bias->to(torch::kFloat).contiguous();
  const float* bias_data = bias.has_value() ? bias_float.data_ptr<float>() : nullptr;
  auto out = torch::empty({x.size(0), weight.size(0)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "few_rows_linear", [&] {
    linear<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), bias_data, out.data_ptr<scalar_t>(),
                     x.size(0), x.size(1), weight.size(0));
  });
  return out;
}

}  // namespace kvchat
