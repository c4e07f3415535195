// Every decoder layer of a decode step in one call from Python, for the CPU.
//
// At batch 1 reading SmolLM2's weights takes ~17 ms a step; the ~20 small operations around the four
// matrix products of each of its 30 layers took ~7 ms more from Python (module calls, views, dispatch),
// though their arithmetic takes microseconds.  Here the same kernels run in the same order from C++, so
// the step computes what models/decoder.py computes, bit for bit (tests/engine/test_cpu_kernels.py), and
// the attention each cached token receives is summed over layers and heads for session eviction.
//
// The layers call the kernels' raw forms on buffers made once per step: through torch's ops (views of
// q, k and v, each product's output, the layer's part of the cache) about a quarter of the main thread's
// time in an int8 batch-1 pass went to making and freeing tensors and dispatching, more than attention.
#include <cmath>
#include <initializer_list>
#include <utility>

#include "float_args.h"
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

// A tensor's elements without data_ptr<T>'s dtype check (forward and the constructor check the dtypes
// once): checked on each of a pass's ~1,000 calls, it took 4 % of the main thread in an int8 batch-1 pass.
template <typename T>
T* elements(const torch::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

void check_long(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kLong && t.is_contiguous(), name, ": contiguous int64");
}

// forward's arguments, checked once for a pass that reads them through raw pointers.
void check_step(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& kv_cache,
                const std::optional<torch::Tensor>& kv_scales, int64_t head_dim,
                std::initializer_list<std::pair<const torch::Tensor&, const char*>> indices) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.sizes() == x.sizes() && residual.is_contiguous() &&
                  residual.scalar_type() == x.scalar_type(),
              "x and residual: contiguous (rows, hidden) of one dtype");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16, "x: float32 or bf16");
  for (const auto& [t, name] : indices) {
    check_long(t, name);
    TORCH_CHECK(t.size(0) == x.size(0), name, ": one per row");
  }
  const bool int8 = kv_cache.scalar_type() == torch::kChar;
  TORCH_CHECK(int8 || kv_cache.scalar_type() == x.scalar_type(), "kv_cache: int8 or of x's dtype");
  TORCH_CHECK(int8 == kv_scales.has_value(), "an int8 cache needs its scales, a float cache has none");
  if (int8)
    TORCH_CHECK(kv_scales->scalar_type() == torch::kFloat && kv_scales->is_contiguous() &&
                    kv_scales->numel() == kv_cache.numel() / head_dim,
                "kv_scales: contiguous float32 (layers, 2, blocks, kv_heads, 16)");
}

}  // namespace

// A decode step's tensors as forward takes them, and the buffers its layers write, (rows, width) each.
struct DecodeStep {
  torch::Tensor x, residual, positions, kv_cache, block_tables, context_lens, slot_blocks, slot_offsets;
  std::optional<torch::Tensor> kv_scales;
  int64_t kernel_rows;
  torch::Tensor qkv, attended, hidden, gate_up, activated;
  torch::Tensor received_parts;  // (rows, kv_heads, max_context) float32, where the step sums attention
};

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
  TORCH_CHECK(!layers_.empty() && heads % kv_heads == 0 && heads / kv_heads <= 8,
              "layers, and 1 to 8 query heads per KV head");
  TORCH_CHECK(head_dim % 32 == 0 && cos_.is_contiguous() && sin_.is_contiguous() && cos_.size(1) == head_dim,
              "head_dim a multiple of 32, cos and sin contiguous (positions, head_dim) tables");
  for (LayerWeights& layer : layers_) {
    const std::optional<torch::Tensor> input_norm = layer.input_norm, post_norm = layer.post_norm;
    for (const auto& norm : {input_norm, post_norm, layer.q_norm, layer.k_norm})
      TORCH_CHECK(!norm || (norm->is_contiguous() && norm->scalar_type() == cos_.scalar_type()),
                  "norm weights: contiguous, of the compute dtype (cos's)");
    for (LinearWeights* w : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) {
      TORCH_CHECK(!w->scale || (w->scale->scalar_type() == torch::kFloat && w->scale->is_contiguous()),
                  "int8 scales: contiguous float32");
      w->float_bias = as_float(w->bias);
      const bool amx = w->packed.has_value() && w->packed->scalar_type() == torch::kBFloat16 &&
                       packed_linear_on_amx(w->packed->size(1) * 2);
      w->vector_path = w->packed.has_value() && !amx;  // as packed_linear chooses
    }
  }
}

torch::Tensor DecodeLayers::linear(const torch::Tensor& x, const LinearWeights& w, const torch::Tensor& buffer,
                                   int64_t kernel_rows) const {
  if (kernel_rows <= max_kernel_rows_) {  // as layers/linear.py's Linear.forward chooses
    if (w.vector_path) {
      packed_linear_rows(elements<c10::BFloat16>(x), x.size(0), *w.packed,
                         w.float_bias ? elements<float>(*w.float_bias) : nullptr,
                         w.scale ? elements<float>(*w.scale) : nullptr, elements<c10::BFloat16>(buffer));
      return buffer;
    }
    if (w.packed.has_value()) return packed_linear(x, *w.packed, w.bias, w.scale);
    return few_rows_linear(x, w.weight, w.bias, w.scale);
  }
  if (w.onednn.has_value()) return onednn_linear(x, *w.onednn, w.bias);
  return w.scale.has_value() ? int8_linear(x, w.weight, *w.scale, w.bias) : at::linear(x, w.weight, w.bias);
}

template <typename T, typename C>
void DecodeLayers::run_layers(DecodeStep& s) const {
  const int64_t rows = s.x.size(0), hidden = s.x.size(1), hd = head_dim_, kv_width = kv_heads_ * hd;
  const int64_t q_width = heads_ * hd, qkv_width = q_width + 2 * kv_width, width = s.gate_up.size(1) / 2;
  const int64_t blocks = s.kv_cache.size(2), block_size = s.kv_cache.size(4) / hd;
  const int64_t values_at = blocks * kv_heads_ * hd * block_size, value_scales_at = blocks * kv_heads_ * block_size;
  C* cache = elements<C>(s.kv_cache);
  float* scales = s.kv_scales.has_value() ? elements<float>(*s.kv_scales) : nullptr;
  DecodeProblem problem{heads_, hd, kv_heads_, s.block_tables.size(1), s.block_tables.size(1) * block_size,
                        qkv_width, static_cast<float>(std::pow(static_cast<double>(hd), -0.5)), nullptr, nullptr,
                        elements<int64_t>(s.block_tables), elements<int64_t>(s.context_lens)};
  float* received = s.received_parts.defined() ? elements<float>(s.received_parts) : nullptr;
  const int64_t* positions = elements<int64_t>(s.positions);
  T* residual = elements<T>(s.residual);
  const T *cos = elements<T>(cos_), *sin = elements<T>(sin_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerWeights& w = layers_[i];
    const LayerKv<C> kv{cache + i * 2 * values_at, scales != nullptr ? scales + i * 2 * value_scales_at : nullptr,
                        blocks, kv_heads_, hd, block_size};
    add_rms_norm_rows(elements<T>(s.x), residual, elements<T>(w.input_norm), rows, hidden, eps_);
    const torch::Tensor qkv = linear(s.x, w.qkv, s.qkv, s.kernel_rows);
    T *q = elements<T>(qkv), *k = q + q_width, *v = k + kv_width;
    if (w.q_norm.has_value()) {  // Qwen3
      rms_norm_heads(q, rows, heads_, qkv_width, elements<T>(*w.q_norm), hd, eps_);
      rms_norm_heads(k, rows, kv_heads_, qkv_width, elements<T>(*w.k_norm), hd, eps_);
    }
    rotary_rows(q, rows, heads_, qkv_width, positions, cos, sin, hd);
    rotary_rows(k, rows, kv_heads_, qkv_width, positions, cos, sin, hd);
    write_kv_rows(k, v, rows, qkv_width, qkv_width, elements<int64_t>(s.slot_blocks),
                  elements<int64_t>(s.slot_offsets), kv);
    problem.k_scales = kv.scales;
    problem.v_scales = kv.scales != nullptr ? kv.scales + value_scales_at : nullptr;
    decode_attention_rows(problem, rows, q, kv.data, kv.data + values_at, elements<T>(s.attended), received);
    s.x = linear(s.attended, w.o, s.hidden, s.kernel_rows);
    add_rms_norm_rows(elements<T>(s.x), residual, elements<T>(w.post_norm), rows, hidden, eps_);
    const torch::Tensor gate_up = linear(s.x, w.gate_up, s.gate_up, s.kernel_rows);
    silu_and_mul_rows(elements<T>(gate_up), rows, 2 * width, width, elements<T>(s.activated));
    s.x = linear(s.activated, w.down, s.hidden, s.kernel_rows);
  }
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> DecodeLayers::forward(
    torch::Tensor x, torch::Tensor residual, torch::Tensor positions, torch::Tensor kv_cache,
    std::optional<torch::Tensor> kv_scales, torch::Tensor block_tables, torch::Tensor context_lens,
    torch::Tensor slot_blocks, torch::Tensor slot_offsets, int64_t kernel_rows, bool sum_attention) const {
  const int64_t layers = static_cast<int64_t>(layers_.size()), rows = x.size(0), hd = head_dim_;
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == layers && kv_cache.size(3) == kv_heads_ &&
                  kv_cache.size(4) == kBlock * hd && kv_cache.is_contiguous(),
              "kv_cache: contiguous (layers, 2, blocks, kv_heads, 16 * head_dim)");
  check_step(x, residual, kv_cache, kv_scales, hd,
             {{positions, "positions"}, {block_tables, "block_tables"}, {context_lens, "context_lens"},
              {slot_blocks, "slot_blocks"}, {slot_offsets, "slot_offsets"}});
  TORCH_CHECK(cos_.scalar_type() == x.scalar_type(), "cos and sin: of x's dtype");
  const auto buffer = [&](int64_t width) { return torch::empty({rows, width}, x.options()); };
  const int64_t width = layers_[0].down.weight.size(1);
  DecodeStep step{x, residual, positions, kv_cache, block_tables, context_lens, slot_blocks, slot_offsets,
                  kv_scales, kernel_rows, buffer((heads_ + 2 * kv_heads_) * hd), buffer(heads_ * hd),
                  buffer(x.size(1)), buffer(2 * width), buffer(width)};
  if (sum_attention)
    step.received_parts = torch::zeros({rows, kv_heads_, block_tables.size(1) * kBlock}, torch::kFloat);
  const auto run = [&](auto t) {
    using T = decltype(t);
    if (kv_cache.scalar_type() == torch::kChar)
      run_layers<T, int8_t>(step);
    else
      run_layers<T, T>(step);
  };
  if (x.scalar_type() == torch::kFloat)
    run(float{});
  else
    run(c10::BFloat16{});
  // Each KV head's row summed the attention over layers, then the heads are summed once.
  return {step.x, step.residual, sum_attention ? step.received_parts.sum(1) : torch::Tensor()};
}

}  // namespace kvchat
