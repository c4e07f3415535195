#include "kernels.h"

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &kvchat::paged_decode_attention,
        "single-token queries' attention over the paged cache, and the probabilities summed over heads");
  m.def("paged_prefill_attention", &kvchat::paged_prefill_attention,
        "a prefill chunk's attention over the paged cache, and the attention its last rows gave each token");
  m.def("few_rows_linear", &kvchat::few_rows_linear, "x @ weight.T + bias for a few rows of x (int8 weights: with scale)",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("scale") = py::none());
  m.def("packed_linear_available", &kvchat::packed_linear_available, "whether the CPU has AVX-512 BF16 units and VBMI");
  m.def("packed_linear_on_amx", &kvchat::packed_linear_on_amx, "whether products of `in` inputs run on AMX tiles",
        py::arg("in"));
  m.def("packed_linear_rows_per_pass", &kvchat::packed_linear_rows_per_pass,
        "rows of x one pass over a packed weight of `in` inputs serves", py::arg("in"));
  m.def("pack_weight", &kvchat::pack_weight, "a bf16 or int8 weight in packed_linear's layout");
  m.def("packed_linear", &kvchat::packed_linear, "x @ weight.T + bias on bf16 dot-product units (int8: with scale)",
        py::arg("x"), py::arg("packed"), py::arg("bias") = py::none(), py::arg("scale") = py::none());
  m.def("rms_norm", &kvchat::rms_norm, "transformers' RMSNorm");
  m.def("add_rms_norm", &kvchat::add_rms_norm, "residual += x, then x = RMSNorm(residual), in place");
  m.def("silu_and_mul", &kvchat::silu_and_mul, "silu(gate) * up for x = [gate | up], torch's roundings");
  m.def("rotary", &kvchat::rotary, "rotary embedding of q and k in place (rotate-half layout)");
  m.def("write_kv", &kvchat::write_kv, "new keys and values into their cache slots (int8: quantized)");
  m.def("argmax_rows", &kvchat::argmax_rows, "each row's argmax, the first of equal maxima, as torch's max");

  py::class_<kvchat::LinearWeights>(m, "LinearWeights")
      .def(py::init<torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>,
                    std::optional<torch::Tensor>, std::optional<torch::Tensor>>(),
           py::arg("weight"), py::arg("packed") = py::none(), py::arg("onednn") = py::none(),
           py::arg("bias") = py::none(), py::arg("scale") = py::none());
  py::class_<kvchat::LayerWeights>(m, "LayerWeights")
      .def(py::init<torch::Tensor, torch::Tensor, kvchat::LinearWeights, kvchat::LinearWeights,
                    kvchat::LinearWeights, kvchat::LinearWeights, std::optional<torch::Tensor>,
                    std::optional<torch::Tensor>>(),
           py::arg("input_norm"), py::arg("post_norm"), py::arg("qkv"), py::arg("o"), py::arg("gate_up"),
           py::arg("down"), py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none());
  py::class_<kvchat::DecodeLayers>(m, "DecodeLayers")
      .def(py::init<std::vector<kvchat::LayerWeights>, int64_t, int64_t, int64_t, double, torch::Tensor,
                    torch::Tensor, int64_t>(),
           py::arg("layers"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("eps"),
           py::arg("cos"), py::arg("sin"), py::arg("max_kernel_rows"))
      .def("forward", &kvchat::DecodeLayers::forward, "every decoder layer of a decode step",
           py::arg("x"), py::arg("residual"), py::arg("positions"), py::arg("kv_cache"), py::arg("kv_scales"),
           py::arg("block_tables"), py::arg("context_lens"), py::arg("slot_blocks"), py::arg("slot_offsets"),
           py::arg("kernel_rows"), py::arg("sum_attention"),
           py::call_guard<py::gil_scoped_release>());  // no Python objects inside: other threads may run
}
