// The operations our C++ CPU extension exposes to Python (bound in bindings.cpp).
#pragma once

#include <torch/extension.h>

#include <optional>

namespace kvchat {

// Decode attention over the paged KV cache (paged_attention_cpu.cpp).
torch::Tensor paged_qk(torch::Tensor q, torch::Tensor k_cache, torch::Tensor block_tables,
                       torch::Tensor context_lens, int64_t max_context, double scale);
torch::Tensor paged_pv(torch::Tensor probs, torch::Tensor v_cache, torch::Tensor block_tables,
                       torch::Tensor context_lens);

// Prefill attention of one chunk over the paged KV cache, and the attention each token received from the
// chunk's last `window` positions (prefill_attention_cpu.cpp).
std::tuple<torch::Tensor, torch::Tensor> paged_prefill_attention(torch::Tensor q, torch::Tensor k_cache,
                                                                 torch::Tensor v_cache, torch::Tensor block_table,
                                                                 int64_t cached, double scale, int64_t window);

// x @ weight.T + bias for a few rows of x (few_rows_linear_cpu.cpp).
torch::Tensor few_rows_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias);

// Per-layer operations of a decode step (layer_ops_cpu.cpp); rotary and the residual update work in place.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
void add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps);
void rotary(torch::Tensor q, torch::Tensor k, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin);
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor layer_cache, torch::Tensor slot_blocks,
              torch::Tensor slot_offsets);

}  // namespace kvchat
