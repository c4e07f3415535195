// Every decoder layer of a decode step in one call from Python, for the CPU.
//
// At batch 1 reading SmolLM2's weights takes ~17 ms a step; the ~20 small operations around the four
// matrix products of each of its 30 layers took ~7 ms more from Python (module calls, views, dispatch),
// though their arithmetic takes microseconds.  Here the same kernels and torch ops run in the same order
// from C++, so the step computes what models/decoder.py computes, bit for bit
// (tests/engine/test_cpu_kernels.py), and the attention each cached token receives is summed over
// layers and heads in one tensor for session eviction.
#include <cmath>

#include "kernels.h"

namespace kvchat {
namespace {

// engine/quantization.py's int8_linear, op for op: torch's product in x's dtype, scale and bias in float32.
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scale,
                          const std::optional<torch::Tensor>& bias) {
  torch::Tensor out = at::linear(x, q.to(x.scalar_type())) * scale;
  if (bias.has_value()) out = out + *bias;
  return out.to(x.scalar_type());
}

// layers/linear.py's oneDNN product, through torch's dispatcher: a weight reordered once by
// torch.ops.mkldnn._reorder_linear_weight.
torch::Tensor onednn_linear(const torch::Tensor& x, const torch::Tensor& weight,
                            const std::optional<torch::Tensor>& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const std::optional<torch::Tensor>&,
                               c10::string_view, c10::List<std::optional<c10::Scalar>>,
                               std::optional<c10::string_view>)>();
  return op.call(x, weight, bias, "none", c10::List<std::optional<c10::Scalar>>(), std::nullopt);
}

}  // namespace

DecodeLayers::DecodeLayers(std::vector<LayerWeights> layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                           double eps, torch::Tensor cos, torch::Tensor sin, int64_t max_kernel_rows)
    : layers_(std::move(layers)),
      heads_(heads),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      eps_(eps),
      cos_(std::move(cos)),
      sin_(std::move(sin)),
      max_kernel_rows_(max_kernel_rows) {
  TORCH_CHECK(!layers_.empty() && heads % kv_heads == 0, "layers and a head count divisible by kv_heads");
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> DecodeLayers::forward(
    torch::Tensor x, torch::Tensor residual, torch::Tensor positions, torch::Tensor kv_cache,
    std::optional<torch::Tensor> kv_scales, torch::Tensor block_tables, torch::Tensor context_lens,
    torch::Tensor slot_blocks, torch::Tensor slot_offsets, int64_t kernel_rows, bool sum_attention) const {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == static_cast<int64_t>(layers_.size()),
              "kv_cache: (layers, 2, blocks, kv_heads, block_size * head_dim)");
  const int64_t rows = x.size(0), head_dim = head_dim_;
  const int64_t blocks = kv_cache.size(2), block_size = kv_cache.size(4) / head_dim;
  const int64_t max_context = block_tables.size(1) * block_size;
  const double scale = std::pow(static_cast<double>(head_dim), -0.5);  // as Python's head_dim ** -0.5
  const auto linear = [&](const torch::Tensor& input, const LinearWeights& w) {
    if (kernel_rows <= max_kernel_rows_) {  // as layers/linear.py's Linear.forward chooses
      if (w.packed.has_value()) return packed_linear(input, *w.packed, w.bias, w.scale);
      return few_rows_linear(input, w.weight, w.bias, w.scale);
    }
    if (w.onednn.has_value()) return onednn_linear(input, *w.onednn, w.bias);
    return w.scale.has_value() ? int8_linear(input, w.weight, *w.scale, w.bias) : at::linear(input, w.weight, w.bias);
  };
  torch::Tensor received;
  if (sum_attention) received = torch::zeros({rows, max_context}, x.options().dtype(torch::kFloat));
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerWeights& w = layers_[i];
    const torch::Tensor layer_cache = kv_cache[i];
    std::optional<torch::Tensor> layer_scales, key_scales, value_scales;  // an int8 cache's
    if (kv_scales.has_value()) {
      layer_scales = (*kv_scales)[i];
      key_scales = (*layer_scales)[0];
      value_scales = (*layer_scales)[1];
    }
    add_rms_norm(x, residual, w.input_norm, eps_);
    const auto qkv = linear(x, w.qkv).split(
        {heads_ * head_dim, kv_heads_ * head_dim, kv_heads_ * head_dim}, -1);
    torch::Tensor q = qkv[0].view({rows, heads_, head_dim}), k = qkv[1].view({rows, kv_heads_, head_dim});
    const torch::Tensor v = qkv[2].view({rows, kv_heads_, head_dim});
    if (w.q_norm.has_value()) {  // Qwen3
      q = rms_norm(q.reshape({-1, head_dim}), *w.q_norm, eps_).view_as(q);
      k = rms_norm(k.reshape({-1, head_dim}), *w.k_norm, eps_).view_as(k);
    }
    rotary(q, k, positions, cos_, sin_);
    write_kv(k, v, layer_cache, slot_blocks, slot_offsets, layer_scales);
    const torch::Tensor keys = layer_cache[0].view({blocks, kv_heads_, head_dim, block_size});
    const torch::Tensor values = layer_cache[1].view({blocks, kv_heads_, block_size, head_dim});
    const auto [attended, probability_sums] = paged_decode_attention(
        q, keys, values, block_tables, context_lens, scale, key_scales, value_scales, sum_attention);
    if (sum_attention) received.add_(probability_sums);
    x = linear(attended.flatten(1), w.o);
    add_rms_norm(x, residual, w.post_norm, eps_);
    x = linear(silu_and_mul(linear(x, w.gate_up)), w.down);
  }
  return {x, residual, received};
}

}  // namespace kvchat
