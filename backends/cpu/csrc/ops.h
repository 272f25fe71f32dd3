// The torch-facing operators of paged_cpu (registered in register.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_api.h"

namespace paged_cpu {

// Kernel selection: the best the CPU supports, or PAGED_CPU_ISA / set_isa() forcing a lower one.
const IsaKernels& current_kernels();
std::string isa_name();
std::string set_isa(const std::string& name);
std::vector<std::string> supported_isas();

// PAGED_CPU_DEBUG=1: bounds-check every block id a batch reads.
bool debug_checks();

// sliding_window > 0: each query sees only its last sliding_window keys (none before them is read);
// soft_cap > 0: scores are soft-capped. A quantized cache (int8, float8) is read in place.
at::Tensor attention(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& query_start_loc,
                     const at::Tensor& seq_lens, const at::Tensor& block_table, double scale, int64_t split_tokens,
                     int64_t sliding_window, double soft_cap);

// Refuses anything but a contiguous [2, num_blocks, kv_heads, block_size, head_size] cache the kernels can read
// (head_size + 2 for a quantized cache, see kernel_api.h).
void check_cache(const at::Tensor& cache, const char* what);

// The storage type of a cache the kernels can read (refusing any other dtype, naming the supported ones).
KvType kv_type_of(const at::Tensor& cache);

// Elements a quantized cache adds to each vector for its float16 scale.
constexpr int64_t kScaleElements = 2;

void write_kv(const at::Tensor& key, const at::Tensor& value, const at::Tensor& kv_cache,
              const at::Tensor& slot_mapping);

void copy_blocks(at::TensorList kv_caches, const at::Tensor& src_to_dst);

// Structured outputs (token_bitmask.cpp): -inf in place on logits[rows[i], t] for each token t that bitmask[i]
// does not allow, and past the bitmask's last token.
void apply_token_bitmask(const at::Tensor& logits, const at::Tensor& bitmask, const at::Tensor& rows);

// Layer ops (fused_ops.cpp): new outputs in the input dtype, fp32 arithmetic, inputs never modified.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& query,
                                          const at::Tensor& key, const at::Tensor& cos_sin_cache);
// Each head vector of x [T, H, D] (any token and head strides) times the block-diagonal normalised Hadamard matrix,
// by the fast Walsh-Hadamard butterfly in the reference's order (fused_body.h); a new contiguous [T, H, D].
at::Tensor rotate_heads(const at::Tensor& x);
at::Tensor pack_linear(const at::Tensor& weight);
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                  int64_t out_features);
// x @ dequantize(data).T + bias for a packed weight (fmt: QFormat id), read in place; fp32 sums.
// Up to stream_rows rows the packed rows are streamed and dequantized in registers, above that
// dequantized once into fp32 chunks that every row is multiplied against. `interleaved`: q4_0 / q4_1 only, the
// same rows repacked in groups of 8 (quant_x8_body.h), read instead at streaming row counts with int8 activations.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& data, const std::optional<at::Tensor>& scale,
                        const std::optional<at::Tensor>& bias, int64_t fmt, int64_t out_features, int64_t stream_rows,
                        const std::optional<at::Tensor>& interleaved);
// The variant of the layer kernels in use (follows set_isa: `scalar`, else `avx2` where the CPU has it).
std::string fused_isa();
// The packed-weight linear kernels in use: avx512, avx2 or scalar (by default those of the layer kernels).
std::string quant_isa();
// Force the packed-weight kernels (auto, avx512, avx2, scalar); returns the ones now in use.
std::string set_quant_isa(const std::string& name);
// The q8 path's kernels (vnni, avx2 or scalar) and whether streaming calls use it (int8 or fp32).
std::string quant_q8_isa();
// Whether the q8 path runs 16-row tiles on AMX (quant_amx.cpp: the CPU and OS allow it, PAGED_CPU_AMX is not 0).
bool quant_amx();
std::string linear_activations();

// Multi-LoRA (lora_ops.cpp): out[t] = x[t] @ a[slots[t]].T in fp32 (0 where slots[t] < 0), and in place
// y[t] += shrunk[t] @ b[slots[t]].T rounded once to y's dtype (rows with slots[t] < 0 untouched).
at::Tensor lora_shrink(const at::Tensor& x, const at::Tensor& a, const at::Tensor& slots);
void lora_expand(const at::Tensor& y, const at::Tensor& shrunk, const at::Tensor& b, const at::Tensor& slots);
std::string set_linear_activations(const std::string& mode);

}  // namespace paged_cpu
