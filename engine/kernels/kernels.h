// The operations our C++ CPU extension exposes to Python (bound in bindings.cpp).
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>
#include <vector>

#include "kv_types.h"

namespace kvchat {

// Decode attention over the paged KV cache (paged_attention_cpu.cpp): out of q's dtype and, if
// `sum_attention`, the probabilities summed over heads, (seqs, max_blocks * 16) float32.  A cache is of the
// compute dtype, or int8 with its scales (kv_types.h).
std::tuple<torch::Tensor, torch::Tensor> paged_decode_attention(
    torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_tables,
    torch::Tensor context_lens, double scale, std::optional<torch::Tensor> k_scales,
    std::optional<torch::Tensor> v_scales, bool sum_attention);

// Prefill attention of one chunk over the paged KV cache, and the attention each token received from the
// chunk's last `window` positions (prefill_attention_cpu.cpp).
std::tuple<torch::Tensor, torch::Tensor> paged_prefill_attention(
    torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_table, int64_t cached,
    double scale, int64_t window, std::optional<torch::Tensor> k_scales, std::optional<torch::Tensor> v_scales);

// x @ weight.T + bias for a few rows of x; int8 weights come with a scale per output channel, as
// x @ (weight * scale).T + bias (few_rows_linear_cpu.cpp).
torch::Tensor few_rows_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                              std::optional<torch::Tensor> scale);

// x @ weight.T + bias in bf16 on AVX-512 BF16 units, the weight (bf16, or int8 with its scale per output
// channel) packed once by pack_weight (packed_linear_cpu.cpp); available only where the kernels were
// compiled for such a CPU.
bool packed_linear_available();
// Whether packed_linear runs on AMX tiles for `in` inputs: a multiple of 32, compiled for them, lent by Linux
// (bf16 weights only).
bool packed_linear_on_amx(int64_t in);
// Rows of x that one pass over a packed weight serves (a register tile, or AMX's block of tiles): up to
// there a product costs about a read of the weights, past it each row adds its arithmetic.
int64_t packed_linear_rows_per_pass(int64_t in);
torch::Tensor pack_weight(torch::Tensor weight);
torch::Tensor packed_linear(torch::Tensor x, torch::Tensor packed, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> scale);
// packed_linear's vector path (not AMX's) on raw buffers: x (rows, in) and out (rows, out) contiguous; bias and
// scale float32 or nullptr.
void packed_linear_rows(const c10::BFloat16* x, int64_t rows, const torch::Tensor& packed, const float* bias,
                        const float* scale, c10::BFloat16* out);

// Per-layer operations of a decode step (layer_ops_cpu.cpp); rotary and the residual update work in place.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
void add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps);
// silu(gate) * up for x = [gate | up] (rows, 2 * width), rounded as torch's two ops round it.
torch::Tensor silu_and_mul(torch::Tensor x);
void rotary(torch::Tensor q, torch::Tensor k, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin);
// An int8 layer cache quantizes each token's head as engine/quantization.py does, into layer_scales.
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor layer_cache, torch::Tensor slot_blocks,
              torch::Tensor slot_offsets, std::optional<torch::Tensor> layer_scales);

// The forms of the operations above that the decode pass calls on the buffers it holds: no tensors made, no
// arguments checked per call (the tensor forms check theirs and call these).  Rows of q, k, v and
// [gate | up] are `stride` elements apart, each token's heads contiguous; T is float or bf16 here (the
// tensor forms take half too).
template <typename T>
void add_rms_norm_rows(T* x, T* residual, const T* weight, int64_t rows, int64_t size, double eps);
// Each head of each row normalised in place (Qwen3's q and k norms).
template <typename T>
void rms_norm_heads(T* x, int64_t rows, int64_t heads, int64_t stride, const T* weight, int64_t head_dim, double eps);
template <typename T>
void rotary_rows(T* x, int64_t rows, int64_t heads, int64_t stride, const int64_t* positions, const T* cos,
                 const T* sin, int64_t head_dim);
template <typename T>
void silu_and_mul_rows(const T* x, int64_t rows, int64_t stride, int64_t width, T* out);
template <typename T, typename C>
void write_kv_rows(const T* k, const T* v, int64_t tokens, int64_t k_stride, int64_t v_stride,
                   const int64_t* slot_blocks, const int64_t* slot_offsets, const LayerKv<C>& cache);

// paged_decode_attention's problem: q's rows are q_stride apart.
struct DecodeProblem {
  int64_t heads, head_dim, kv_heads, max_blocks, max_context, q_stride;
  float scale;
  const float *k_scales, *v_scales;  // an int8 cache's, else nullptr
  const int64_t *tables, *lens;
};
// out (rows, heads, head_dim) contiguous; received_parts (rows, kv_heads, max_context) added to, or nullptr.
template <typename T, typename C>
void decode_attention_rows(const DecodeProblem& p, int64_t rows, const T* q, const C* k_cache, const C* v_cache,
                           T* out, float* received_parts);

// Each row's index of its largest value, the first of equal ones (a NaN's where a row has one), as
// torch's max(dim=-1).indices; x (rows, n) float32 or bf16 (argmax_cpu.cpp).
torch::Tensor argmax_rows(torch::Tensor x);

// One linear layer's weights as layers/linear.py holds them: packed for packed_linear where the CPU runs it
// and, on AMX machines, bf16 ones reordered for oneDNN; int8 ones with their scale per output channel.
struct LinearWeights {
  torch::Tensor weight;
  std::optional<torch::Tensor> packed, onednn, bias, scale;
  // Set by DecodeLayers: the bias in float32, and whether packed_linear's vector path takes the weight.
  std::optional<torch::Tensor> float_bias;
  bool vector_path = false;
};

// One decoder layer's weights (qkv and gate_up fused); Qwen3's per-head norms where it has them.
struct LayerWeights {
  torch::Tensor input_norm, post_norm;
  LinearWeights qkv, o, gate_up, down;
  std::optional<torch::Tensor> q_norm, k_norm;
};

struct DecodeStep;  // a step's tensors, in decode_layers_cpu.cpp

// A decode step's pass through every decoder layer (decode_layers_cpu.cpp).
class DecodeLayers {
 public:
  // Steps of up to `max_kernel_rows` rows go to packed_linear where a weight is packed, else to
  // few_rows_linear; steps of more rows go to oneDNN where a weight is reordered for it, else to torch.
  // A step's rows count as `kernel_rows` there: its rows without speculative drafts.
  DecodeLayers(std::vector<LayerWeights> layers, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
               torch::Tensor cos, torch::Tensor sin, int64_t max_kernel_rows);

  // (x, residual) after the last layer, and, if `sum_attention`, the attention each context position
  // received, summed over layers and heads: (rows, max_context) float32.  kv_scales: an int8 cache's.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(
      torch::Tensor x, torch::Tensor residual, torch::Tensor positions, torch::Tensor kv_cache,
      std::optional<torch::Tensor> kv_scales, torch::Tensor block_tables, torch::Tensor context_lens,
      torch::Tensor slot_blocks, torch::Tensor slot_offsets, int64_t kernel_rows, bool sum_attention) const;

 private:
  std::vector<LayerWeights> layers_;
  int64_t heads_, kv_heads_, head_dim_;
  double eps_;
  torch::Tensor cos_, sin_;
  int64_t max_kernel_rows_;

  template <typename T, typename C>
  void run_layers(DecodeStep& step) const;
  torch::Tensor linear(const torch::Tensor& x, const LinearWeights& w, const torch::Tensor& buffer,
                       int64_t kernel_rows) const;
};

}  // namespace kvchat
