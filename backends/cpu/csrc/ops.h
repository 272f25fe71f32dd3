// The torch-facing operators of paged_cpu (registered in register.cpp).
#pragma once

#include <ATen/ATen.h>

#include <string>
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

at::Tensor attention(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& query_start_loc,
                     const at::Tensor& seq_lens, const at::Tensor& block_table, double scale, int64_t split_tokens);

// Refuses anything but a contiguous [2, num_blocks, kv_heads, block_size, head_size] cache the kernels can read.
void check_cache(const at::Tensor& cache, const char* what);

void write_kv(const at::Tensor& key, const at::Tensor& value, const at::Tensor& kv_cache,
              const at::Tensor& slot_mapping);

void copy_blocks(at::TensorList kv_caches, const at::Tensor& src_to_dst);

}  // namespace paged_cpu
