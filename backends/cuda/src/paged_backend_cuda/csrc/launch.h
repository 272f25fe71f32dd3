// The kernels' host entry points: plain pointers, sizes and a stream, so that neither the kernel files
// nor their resource report need torch; binding.cpp adapts torch tensors to them.
#pragma once

#include <cstdint>

namespace paged_cuda {

// Element types, as binding.cpp maps torch's dtypes.
enum DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

struct AttentionArgs {
  const void* query;      // [T, num_heads, head_size], last dim contiguous
  int64_t q_stride_token;  // elements
  int64_t q_stride_head;
  void* out;               // [T, num_heads, head_size] contiguous
  const void* key_cache;   // [num_blocks, block_size, num_kv_heads, head_size] contiguous (kv_cache[0])
  const void* value_cache; // kv_cache[1]
  const int32_t* query_start_loc;  // [B + 1]
  const int32_t* seq_lens;         // [B]
  const int32_t* block_table;      // [B, table_width]
  int64_t table_width;
  int first_row;           // rows [first_row, first_row + num_rows) of the batch
  int num_rows;
  int max_query_len;       // bound on the rows' query lengths (host int; frozen in graphs)
  int num_heads;
  int num_kv_heads;
  int head_size;
  int block_size;
  float scale;
  float soft_cap;          // 0: off
  int window;              // 0: off; else keys j with pos - window < j <= pos
  int num_splits;          // > 1: partial results go to the buffers below, then a reduction
  int split_keys;          // keys per split
  float* partial_out;      // [T, num_heads, num_splits, head_size]
  float* partial_max;      // [T, num_heads, num_splits]
  float* partial_sum;      // [T, num_heads, num_splits]
  int rows_per_tile;       // 1, 4 or 8 query rows (tokens x heads of one KV head) per thread block
};

// Each returns 0, or a message naming an unsupported argument.
// Query, output and cache share `dtype` (the Python side converts a query of another dtype).
const char* launch_attention(const AttentionArgs& a, DType dtype, void* stream);
const char* launch_reduce(const AttentionArgs& a, int num_tokens, DType out_dtype, void* stream);
const char* launch_write_kv(const void* key, const void* value, int64_t k_stride_token, int64_t k_stride_head,
                            int64_t v_stride_token, int64_t v_stride_head, void* kv_cache, const int64_t* slots,
                            int num_tokens, int num_kv_heads, int head_size, int64_t num_slots, DType src_dtype,
                            DType cache_dtype, void* stream);
const char* launch_copy_blocks(void* kv_cache, const int64_t* pairs, int num_pairs, int64_t block_bytes,
                               int64_t num_blocks, void* stream);

// The head sizes with compiled kernels (also what the backend declares).
constexpr int kHeadSizes[] = {64, 80, 96, 112, 128, 160, 192, 256};

}  // namespace paged_cuda
