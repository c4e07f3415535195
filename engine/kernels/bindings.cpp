#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_qk", &kvchat::paged_qk, "scaled q.k over the paged cache, -inf past each context");
  m.def("paged_pv", &kvchat::paged_pv, "probabilities times values over the paged cache");
  m.def("paged_prefill_attention", &kvchat::paged_prefill_attention,
        "a prefill chunk's attention over the paged cache, and the attention its last rows gave each token");
  m.def("few_rows_linear", &kvchat::few_rows_linear, "x @ weight.T + bias, for a few rows of x");
  m.def("rms_norm", &kvchat::rms_norm, "transformers' RMSNorm");
  m.def("add_rms_norm", &kvchat::add_rms_norm, "residual += x, then x = RMSNorm(residual), in place");
  m.def("rotary", &kvchat::rotary, "rotary embedding of q and k in place (rotate-half layout)");
  m.def("write_kv", &kvchat::write_kv, "new keys and values into their cache slots");
}
