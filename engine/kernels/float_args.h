// Optional arguments our kernels read as float32 (a bias, int8 weights' scales), whatever their dtype.
#pragma once

#include <torch/extension.h>

#include <optional>

namespace kvchat {

inline std::optional<torch::Tensor> as_float(const std::optional<torch::Tensor>& tensor) {
  if (!tensor.has_value()) return std::nullopt;
  // Already float32 (int8 scales always are): no dispatch, which would cost a torch op per product.
  if (tensor->scalar_type() == torch::kFloat && tensor->is_contiguous()) return tensor;
  return tensor->to(torch::kFloat).contiguous();
}

inline const float* data_or_null(const std::optional<torch::Tensor>& tensor) {
  return tensor.has_value() ? tensor->data_ptr<float>() : nullptr;
}

}  // namespace kvchat
