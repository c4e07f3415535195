// The operations our C++ CPU extension exposes to Python (bound in bindings.cpp).
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>
#include <vector>

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

// Per-layer operations of a decode step (layer_ops_cpu.cpp); rotary and the residual update work in place.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
void add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps);
// silu(gate) * up for x = [gate | up] (rows, 2 * width), rounded as torch's two ops round it.
torch::Tensor silu_and_mul(torch::Tensor x);
void rotary(torch::Tensor q, torch::Tensor k, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin);
// An int8 layer cache quantizes each token's head as engine/quantization.py does, into layer_scales.
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor layer_cache, torch::Tensor slot_blocks,
              torch::Tensor slot_offsets, std::optional<torch::Tensor> layer_scales);

// Each row's index of its largest value, the first of equal ones (a NaN's where a row has one), as
// torch's max(dim=-1).indices; x (rows, n) float32 or bf16 (argmax_cpu.cpp).
torch::Tensor argmax_rows(torch::Tensor x);

// One linear layer's weights as layers/linear.py holds them: packed for packed_linear where the CPU runs it
// and, on AMX machines, bf16 ones reordered for oneDNN; int8 ones with their scale per output channel.
struct LinearWeights {
  torch::Tensor weight;
  std::optional<torch::Tensor> packed, onednn, bias, scale;
};

// One decoder layer's weights (qkv and gate_up fused); Qwen3's per-head norms where it has them.
struct LayerWeights {
  torch::Tensor input_norm, post_norm;
  LinearWeights qkv, o, gate_up, down;
  std::optional<torch::Tensor> q_norm, k_norm;
};

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
};

}  // namespace kvchat
