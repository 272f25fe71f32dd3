// The torch side of the kernels, through the LibTorch stable ABI only: one shared library serves every
// torch release from 2.10 on (built with TORCH_TARGET_VERSION), and nothing here includes ATen.
// Every op writes into tensors the caller allocated, so this file never creates a tensor.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <string>

#include "launch.h"

namespace paged_cuda {
namespace {

using torch::stable::Tensor;
using ST = torch::headeronly::ScalarType;

DType dtype_of(const Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case ST::Float: return kFloat32;
    case ST::BFloat16: return kBFloat16;
    case ST::Half: return kFloat16;
    default: break;
  }
  STD_TORCH_CHECK(false, what, ": unsupported dtype (supported: float32, bfloat16, float16)");
  return kFloat32;
}

void check_cuda(const Tensor& t, const char* what, const Tensor& anchor) {
  STD_TORCH_CHECK(t.is_cuda(), what, " must be a CUDA tensor");
  STD_TORCH_CHECK(t.get_device_index() == anchor.get_device_index(), what, " is on another device");
}

void check_int(const Tensor& t, const char* what, ST want) {
  STD_TORCH_CHECK(t.scalar_type() == want, what, " has the wrong integer dtype");
  STD_TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
}

void* stream_of(const Tensor& t) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "cannot get the current CUDA stream");
  return stream;
}

void raise_if(const char* error) { STD_TORCH_CHECK(error == nullptr, error ? error : ""); }

void write_kv(Tensor key, Tensor value, Tensor kv_cache, Tensor slot_mapping) {
  check_cuda(key, "key", kv_cache);
  check_cuda(value, "value", kv_cache);
  check_cuda(slot_mapping, "slot_mapping", kv_cache);
  check_int(slot_mapping, "slot_mapping", ST::Long);
  STD_TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.is_contiguous(), "kv_cache must be a contiguous 5-d tensor");
  STD_TORCH_CHECK(key.dim() == 3 && value.dim() == 3, "key and value must be [T, kv_heads, head_size]");
  STD_TORCH_CHECK(key.scalar_type() == value.scalar_type(), "key and value must share a dtype");
  STD_TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1, "key and value need a contiguous last dimension");
  const int64_t tokens = slot_mapping.size(0);
  STD_TORCH_CHECK(key.size(0) == tokens && value.size(0) == tokens, "key/value rows != slot_mapping length");
  STD_TORCH_CHECK(key.size(1) == kv_cache.size(3) && key.size(2) == kv_cache.size(4), "key shape != cache heads");
  torch::stable::accelerator::DeviceGuard guard(kv_cache.get_device_index());
  raise_if(launch_write_kv(key.data_ptr(), value.data_ptr(), key.stride(0), key.stride(1), value.stride(0),
                           value.stride(1), kv_cache.data_ptr(), static_cast<const int64_t*>(slot_mapping.data_ptr()),
                           static_cast<int>(tokens), static_cast<int>(kv_cache.size(3)),
                           static_cast<int>(kv_cache.size(4)), kv_cache.size(1) * kv_cache.size(2),
                           dtype_of(key, "key"), dtype_of(kv_cache, "kv_cache"), stream_of(kv_cache)));
}

void copy_blocks(Tensor kv_cache, Tensor pairs) {
  check_cuda(pairs, "src_to_dst", kv_cache);
  check_int(pairs, "src_to_dst", ST::Long);
  STD_TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.is_contiguous(), "kv_cache must be a contiguous 5-d tensor");
  STD_TORCH_CHECK(pairs.dim() == 2 && pairs.size(1) == 2, "src_to_dst must be [N, 2]");
  const int64_t block_bytes =
      kv_cache.size(2) * kv_cache.size(3) * kv_cache.size(4) * static_cast<int64_t>(kv_cache.element_size());
  torch::stable::accelerator::DeviceGuard guard(kv_cache.get_device_index());
  raise_if(launch_copy_blocks(kv_cache.data_ptr(), static_cast<const int64_t*>(pairs.data_ptr()),
                              static_cast<int>(pairs.size(0)), block_bytes, kv_cache.size(1), stream_of(kv_cache)));
}

// out/query [T, H, D]; partials [T, H, S, D] fp32 and [T, H, S] fp32 (unused, may be empty, when S == 1).
void attention(Tensor out, Tensor query, Tensor kv_cache, Tensor query_start_loc, Tensor seq_lens,
               Tensor block_table, Tensor partial_out, Tensor partial_max, Tensor partial_sum, int64_t first_row,
               int64_t num_rows, int64_t max_query_len, int64_t num_splits, int64_t split_keys,
               int64_t rows_per_tile, double scale, double soft_cap, int64_t window, int64_t reduce_tokens) {
  for (const Tensor* t : {&out, &query, &query_start_loc, &seq_lens, &block_table})
    check_cuda(*t, "attention input", kv_cache);
  check_int(query_start_loc, "query_start_loc", ST::Int);
  check_int(seq_lens, "seq_lens", ST::Int);
  STD_TORCH_CHECK(block_table.scalar_type() == ST::Int && block_table.stride(1) == 1,
                  "block_table must be int32 with contiguous rows");
  STD_TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.is_contiguous(), "kv_cache must be a contiguous 5-d tensor");
  STD_TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1, "query must be [T, H, D] with a contiguous last dim");
  STD_TORCH_CHECK(out.is_contiguous() && out.scalar_type() == query.scalar_type(), "out must match query");
  STD_TORCH_CHECK(query.size(2) == kv_cache.size(4), "query head size != cache head size");
  STD_TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type(), "query and kv_cache must share a dtype");
  AttentionArgs a{};
  a.query = query.data_ptr();
  a.q_stride_token = query.stride(0);
  a.q_stride_head = query.stride(1);
  a.out = out.data_ptr();
  const int64_t half = kv_cache.size(1) * kv_cache.size(2) * kv_cache.size(3) * kv_cache.size(4);
  a.key_cache = kv_cache.data_ptr();
  a.value_cache = static_cast<const char*>(kv_cache.data_ptr()) + half * kv_cache.element_size();
  a.query_start_loc = static_cast<const int32_t*>(query_start_loc.data_ptr());
  a.seq_lens = static_cast<const int32_t*>(seq_lens.data_ptr());
  a.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  a.table_width = block_table.stride(0);
  a.first_row = static_cast<int>(first_row);
  a.num_rows = static_cast<int>(num_rows);
  a.max_query_len = static_cast<int>(max_query_len);
  a.num_heads = static_cast<int>(query.size(1));
  a.num_kv_heads = static_cast<int>(kv_cache.size(3));
  a.head_size = static_cast<int>(query.size(2));
  a.block_size = static_cast<int>(kv_cache.size(2));
  a.scale = static_cast<float>(scale);
  a.soft_cap = static_cast<float>(soft_cap);
  a.window = static_cast<int>(window);
  a.num_splits = static_cast<int>(num_splits);
  a.split_keys = static_cast<int>(split_keys);
  a.rows_per_tile = static_cast<int>(rows_per_tile);
  STD_TORCH_CHECK(first_row >= 0 && first_row + num_rows <= seq_lens.size(0), "rows out of range");
  if (num_splits > 1) {
    // Partials exist for the split launch's tokens only (decode rows: tokens [0, reduce_tokens)).
    STD_TORCH_CHECK(reduce_tokens >= 0 && reduce_tokens <= query.size(0), "reduce_tokens out of range");
    const int64_t need = reduce_tokens * query.size(1) * num_splits;
    STD_TORCH_CHECK(partial_out.numel() >= need * query.size(2) && partial_max.numel() >= need &&
                        partial_sum.numel() >= need && partial_out.scalar_type() == ST::Float &&
                        partial_max.scalar_type() == ST::Float && partial_sum.scalar_type() == ST::Float,
                    "partial buffers too small or not float32");
    a.partial_out = static_cast<float*>(partial_out.data_ptr());
    a.partial_max = static_cast<float*>(partial_max.data_ptr());
    a.partial_sum = static_cast<float*>(partial_sum.data_ptr());
  }
  torch::stable::accelerator::DeviceGuard guard(kv_cache.get_device_index());
  void* stream = stream_of(kv_cache);
  raise_if(launch_attention(a, dtype_of(query, "query"), stream));
  if (num_splits > 1) raise_if(launch_reduce(a, static_cast<int>(reduce_tokens), dtype_of(out, "out"), stream));
}

}  // namespace
}  // namespace paged_cuda

STABLE_TORCH_LIBRARY(paged_cuda, m) {
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()");
  m.def("copy_blocks(Tensor(a!) kv_cache, Tensor src_to_dst) -> ()");
  m.def(
      "attention(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor query_start_loc, Tensor seq_lens, "
      "Tensor block_table, Tensor(b!) partial_out, Tensor(c!) partial_max, Tensor(d!) partial_sum, int first_row, "
      "int num_rows, int max_query_len, int num_splits, int split_keys, int rows_per_tile, float scale, "
      "float soft_cap, int window, int reduce_tokens) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(paged_cuda, CUDA, m) {
  m.impl("write_kv", TORCH_BOX(&paged_cuda::write_kv));
  m.impl("copy_blocks", TORCH_BOX(&paged_cuda::copy_blocks));
  m.impl("attention", TORCH_BOX(&paged_cuda::attention));
}
