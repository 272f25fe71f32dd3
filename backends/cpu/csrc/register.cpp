// Operator registration (torch.ops.paged_cpu.*) and the Python module stub that loads it.
#include <Python.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(paged_cpu, m) {
  m.def(
      "attention(Tensor query, Tensor kv_cache, Tensor query_start_loc, Tensor seq_lens, Tensor block_table, "
      "float scale, int split_tokens=0, int sliding_window=0, float soft_cap=0.0) -> Tensor");
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()");
  m.def("copy_blocks(Tensor(a!)[] kv_caches, Tensor src_to_dst) -> ()");
  m.def("apply_token_bitmask(Tensor(a!) logits, Tensor bitmask, Tensor rows) -> ()");
  m.def("isa() -> str", &paged_cpu::isa_name);
  m.def("set_isa(str name) -> str", &paged_cpu::set_isa);
  m.def("supported_isas() -> str[]", &paged_cpu::supported_isas);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rotary(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache) -> (Tensor, Tensor)");
  m.def("rotate_heads(Tensor x) -> Tensor");
  m.def("pack_linear(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("quant_linear(Tensor x, Tensor data, Tensor? scale, Tensor? bias, int fmt, int out_features, "
        "int stream_rows, Tensor? interleaved=None) -> Tensor");
  m.def("fused_isa() -> str", &paged_cpu::fused_isa);
  m.def("quant_isa() -> str", &paged_cpu::quant_isa);
  m.def("set_quant_isa(str name) -> str", &paged_cpu::set_quant_isa);
  m.def("quant_q8_isa() -> str", &paged_cpu::quant_q8_isa);
  m.def("quant_amx() -> bool", &paged_cpu::quant_amx);
  m.def("linear_activations() -> str", &paged_cpu::linear_activations);
  m.def("set_linear_activations(str mode) -> str", &paged_cpu::set_linear_activations);
  m.def("lora_shrink(Tensor x, Tensor a, Tensor slots) -> Tensor");
  m.def("lora_expand(Tensor(a!) y, Tensor shrunk, Tensor b, Tensor slots) -> ()");
}

TORCH_LIBRARY_IMPL(paged_cpu, CPU, m) {
  m.impl("attention", &paged_cpu::attention);
  m.impl("write_kv", &paged_cpu::write_kv);
  m.impl("copy_blocks", &paged_cpu::copy_blocks);
  m.impl("apply_token_bitmask", &paged_cpu::apply_token_bitmask);
  m.impl("rms_norm", &paged_cpu::rms_norm);
  m.impl("add_rms_norm", &paged_cpu::add_rms_norm);
  m.impl("silu_and_mul", &paged_cpu::silu_and_mul);
  m.impl("rotary", &paged_cpu::rotary);
  m.impl("rotate_heads", &paged_cpu::rotate_heads);
  m.impl("pack_linear", &paged_cpu::pack_linear);
  m.impl("linear", &paged_cpu::linear);
  m.impl("quant_linear", &paged_cpu::quant_linear);
  m.impl("lora_shrink", &paged_cpu::lora_shrink);
  m.impl("lora_expand", &paged_cpu::lora_expand);
}

// Importing paged_backend_cpu._C runs the static registrations above; the module itself is empty.
static PyModuleDef paged_cpu_module = {PyModuleDef_HEAD_INIT, "_C", "paged_cpu torch operators", -1, nullptr};

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&paged_cpu_module); }
