// Cache kernels: write_kv (one thread block per token; slot -1 and out-of-range slots write nothing, decided
// in the kernel so the launch reads no tensor value) and copy_blocks (whole blocks, 16-byte words).
#include "common.cuh"
#include "launch.h"

namespace paged_cuda {

constexpr int kCacheThreads = 128;

template <typename S, typename C>
__global__ void __launch_bounds__(kCacheThreads)
    write_kv_kernel(const S* __restrict__ key, const S* __restrict__ value, int64_t ks_t, int64_t ks_h,
                    int64_t vs_t, int64_t vs_h, C* __restrict__ cache, const int64_t* __restrict__ slots,
                    int num_kv_heads, int head_size, int64_t num_slots) {
  const int t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  const int per_token = num_kv_heads * head_size;
  C* k_dst = cache + slot * per_token;
  C* v_dst = cache + (num_slots + slot) * per_token;  // the value half starts after every key slot
  for (int e = threadIdx.x; e < per_token; e += kCacheThreads) {
    const int h = e / head_size, d = e - h * head_size;
    k_dst[e] = from_float<C>(to_float(key[t * ks_t + h * ks_h + d]));
    v_dst[e] = from_float<C>(to_float(value[t * vs_t + h * vs_h + d]));
  }
}

__global__ void __launch_bounds__(kCacheThreads)
    copy_blocks_kernel(uint4* __restrict__ cache, const int64_t* __restrict__ pairs, int64_t words_per_block,
                       int64_t num_blocks) {
  const int64_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  if (src < 0 || dst < 0 || src >= num_blocks || dst >= num_blocks) return;
  const int64_t half = blockIdx.y * num_blocks;  // y = 0: keys, 1: values
  const uint4* from = cache + (half + src) * words_per_block;
  uint4* to = cache + (half + dst) * words_per_block;
  for (int64_t w = threadIdx.x; w < words_per_block; w += kCacheThreads) to[w] = from[w];
}

template <typename S, typename C>
static void write_kv_typed(const void* key, const void* value, int64_t ks_t, int64_t ks_h, int64_t vs_t,
                           int64_t vs_h, void* cache, const int64_t* slots, int num_tokens, int num_kv_heads,
                           int head_size, int64_t num_slots, cudaStream_t stream) {
  PAGED_LAUNCH(num_tokens, kCacheThreads, stream, write_kv_kernel<S, C>)(
      static_cast<const S*>(key), static_cast<const S*>(value), ks_t, ks_h, vs_t, vs_h, static_cast<C*>(cache),
      slots, num_kv_heads, head_size, num_slots);
}

template <typename S>
static const char* write_kv_from(const void* key, const void* value, int64_t ks_t, int64_t ks_h, int64_t vs_t,
                                 int64_t vs_h, void* cache, const int64_t* slots, int num_tokens, int num_kv_heads,
                                 int head_size, int64_t num_slots, DType cache_dtype, cudaStream_t stream) {
  switch (cache_dtype) {
    case kFloat32:
      write_kv_typed<S, float>(key, value, ks_t, ks_h, vs_t, vs_h, cache, slots, num_tokens, num_kv_heads,
                               head_size, num_slots, stream);
      return nullptr;
    case kBFloat16:
      write_kv_typed<S, __nv_bfloat16>(key, value, ks_t, ks_h, vs_t, vs_h, cache, slots, num_tokens, num_kv_heads,
                                       head_size, num_slots, stream);
      return nullptr;
    case kFloat16:
      write_kv_typed<S, __half>(key, value, ks_t, ks_h, vs_t, vs_h, cache, slots, num_tokens, num_kv_heads,
                                head_size, num_slots, stream);
      return nullptr;
  }
  return "write_kv: unsupported cache dtype (supported: float32, bfloat16, float16)";
}

const char* launch_write_kv(const void* key, const void* value, int64_t ks_t, int64_t ks_h, int64_t vs_t,
                            int64_t vs_h, void* kv_cache, const int64_t* slots, int num_tokens, int num_kv_heads,
                            int head_size, int64_t num_slots, DType src_dtype, DType cache_dtype, void* stream) {
  if (num_tokens == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  switch (src_dtype) {
    case kFloat32:
      return write_kv_from<float>(key, value, ks_t, ks_h, vs_t, vs_h, kv_cache, slots, num_tokens, num_kv_heads,
                                  head_size, num_slots, cache_dtype, s);
    case kBFloat16:
      return write_kv_from<__nv_bfloat16>(key, value, ks_t, ks_h, vs_t, vs_h, kv_cache, slots, num_tokens,
                                          num_kv_heads, head_size, num_slots, cache_dtype, s);
    case kFloat16:
      return write_kv_from<__half>(key, value, ks_t, ks_h, vs_t, vs_h, kv_cache, slots, num_tokens, num_kv_heads,
                                   head_size, num_slots, cache_dtype, s);
  }
  return "write_kv: unsupported key/value dtype (supported: float32, bfloat16, float16)";
}

const char* launch_copy_blocks(void* kv_cache, const int64_t* pairs, int num_pairs, int64_t block_bytes,
                               int64_t num_blocks, void* stream) {
  if (block_bytes % 16 != 0) return "copy_blocks: a block's bytes must be a multiple of 16";
  if (num_pairs == 0) return nullptr;
  PAGED_LAUNCH(dim3(num_pairs, 2), kCacheThreads, static_cast<cudaStream_t>(stream), copy_blocks_kernel)(
      static_cast<uint4*>(kv_cache), pairs, block_bytes / 16, num_blocks);
  return nullptr;
}

}  // namespace paged_cuda
