// The kernels' host entry points (launch.h) as extern "C" functions for ctypes (emulated.py), built with
// attention.cu and cache.cu by a host compiler. Each returns 0 or an error: the launcher's own (an unsupported
// argument) or else the emulator's (a failed launch: deadlock, bad barrier use).
#include "../launch.h"
#include "cuda_on_cpu.h"

using namespace paged_cuda;

namespace {
const char* first_error(const char* launcher_error) {
  const char* emulator_error = cuda_emu::take_error();
  return launcher_error ? launcher_error : emulator_error;
}
}  // namespace

extern "C" {

// emulated.py reads AttentionArgs' fields from launch.h; this size checks that it read them right.
size_t paged_emu_attention_args_size() { return sizeof(AttentionArgs); }

// launch_attention, then launch_reduce when the launch splits (as binding.cpp's attention op does).
const char* paged_emu_attention(const AttentionArgs* a, int dtype, int reduce_tokens) {
  const char* error = launch_attention(*a, static_cast<DType>(dtype), nullptr);
  if (error == nullptr && a->num_splits > 1)
    error = launch_reduce(*a, reduce_tokens, static_cast<DType>(dtype), nullptr);
  return first_error(error);
}

const char* paged_emu_write_kv(const void* key, const void* value, int64_t k_stride_token, int64_t k_stride_head,
                               int64_t v_stride_token, int64_t v_stride_head, void* kv_cache, const int64_t* slots,
                               int num_tokens, int num_kv_heads, int head_size, int64_t num_slots, int src_dtype,
                               int cache_dtype) {
  return first_error(launch_write_kv(key, value, k_stride_token, k_stride_head, v_stride_token, v_stride_head,
                                     kv_cache, slots, num_tokens, num_kv_heads, head_size, num_slots,
                                     static_cast<DType>(src_dtype), static_cast<DType>(cache_dtype), nullptr));
}

const char* paged_emu_copy_blocks(void* kv_cache, const int64_t* pairs, int num_pairs, int64_t block_bytes,
                                  int64_t num_blocks) {
  return first_error(launch_copy_blocks(kv_cache, pairs, num_pairs, block_bytes, num_blocks, nullptr));
}

}  // extern "C"
