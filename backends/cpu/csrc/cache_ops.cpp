// paged_cpu::write_kv and paged_cpu::copy_blocks: plain copies with every index checked (they are cheap).
// write_kv stores keys in the pair layout of kernel_api.h, and quantizes for an int8 / float8 cache.
#include <ATen/Parallel.h>

#include <cstring>
#include <string>

#include "ops.h"
#include "quant_kv.h"

namespace paged_cpu {
namespace {

// Rows of `src` ([T, KVH, D]) in the cache's dtype, with unit stride along D.
at::Tensor as_cache_rows(const at::Tensor& src, const at::Tensor& cache) {
  at::Tensor t = src.scalar_type() == cache.scalar_type() ? src : src.to(cache.scalar_type());
  return t.stride(2) == 1 ? t : t.contiguous();
}

}  // namespace

void check_cache(const at::Tensor& cache, const char* what) {
  TORCH_CHECK(cache.dim() == 5 && cache.size(0) == 2 && cache.is_contiguous() && cache.size(3) % kKeyGroup == 0 &&
                  cache.size(4) % 2 == 0,
              "paged_cpu: ", what, " must be a contiguous [2, num_blocks, kv_heads, block_size, head_size] with the "
              "block size a multiple of ", kKeyGroup, " and an even head size, got ", cache.sizes());
}

namespace {

// Key row `src` (head_size elements of E) into its tile in the pair layout, from element 2 * slot on.
template <typename E>
void scatter_key(const char* src, char* tile, int64_t slot, int64_t head_size, int64_t block_size) {
  const auto* from = reinterpret_cast<const E*>(src);
  auto* to = reinterpret_cast<E*>(tile) + 2 * slot;
  for (int64_t i = 0; i < head_size / 2; ++i, to += 2 * block_size) {
    to[0] = from[2 * i];
    to[1] = from[2 * i + 1];
  }
}

}  // namespace

void write_kv(const at::Tensor& key, const at::Tensor& value, const at::Tensor& kv_cache,
              const at::Tensor& slot_mapping) {
  check_cache(kv_cache, "kv_cache");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong,
              "paged_cpu: slot_mapping must be int64 [T]");
  const bool quantized = is_quantized(kv_type_of(kv_cache));
  const int64_t tokens = slot_mapping.size(0), kv_heads = kv_cache.size(2), block_size = kv_cache.size(3),
                head_size = kv_cache.size(4) - (quantized ? kScaleElements : 0);
  for (const at::Tensor* t : {&key, &value})
    TORCH_CHECK(t->dim() == 3 && t->size(0) == tokens && t->size(1) == kv_heads && t->size(2) == head_size,
                "paged_cpu: key and value must be [", tokens, ", ", kv_heads, ", ", head_size, "] (one row per slot), got ",
                key.sizes(), " and ", value.sizes());
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t num_slots = kv_cache.size(1) * block_size;
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < num_slots, "paged_cpu: slot_mapping[", t, "] = ", slot[t],
                " is out of range for a cache of ", num_slots, " slots (-1 marks padding)");
  if (quantized) return write_kv_quantized(key, value, kv_cache, slot);
  const at::Tensor k = as_cache_rows(key, kv_cache), v = as_cache_rows(value, kv_cache);
  const int64_t esize = kv_cache.element_size(), row_bytes = head_size * esize;
  auto* base = static_cast<char*>(kv_cache.data_ptr());
  const int64_t plane = kv_cache.stride(0) * esize, block_bytes = kv_cache.stride(1) * esize;
  const int64_t tile_bytes = kv_cache.stride(2) * esize;
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;  // padding: never written
      const int64_t block = slot[t] / block_size, off = slot[t] % block_size;
      for (int64_t h = 0; h < kv_heads; ++h) {
        char* tile = base + block * block_bytes + h * tile_bytes;
        const char* key_row = kp + (t * k.stride(0) + h * k.stride(1)) * esize;
        if (esize == 4)
          scatter_key<uint32_t>(key_row, tile, off, head_size, block_size);
        else
          scatter_key<uint16_t>(key_row, tile, off, head_size, block_size);
        std::memcpy(tile + plane + off * row_bytes, vp + (t * v.stride(0) + h * v.stride(1)) * esize, row_bytes);
      }
    }
  });
}

void copy_blocks(at::TensorList kv_caches, const at::Tensor& src_to_dst) {
  TORCH_CHECK(src_to_dst.dim() == 2 && src_to_dst.size(1) == 2 && src_to_dst.scalar_type() == at::kLong,
              "paged_cpu: src_to_dst must be int64 [N, 2], got ", src_to_dst.scalar_type(), " ", src_to_dst.sizes());
  const at::Tensor pairs = src_to_dst.contiguous();
  const int64_t* ids = pairs.data_ptr<int64_t>();
  const int64_t n = pairs.size(0);
  for (size_t layer = 0; layer < kv_caches.size(); ++layer) {
    const at::Tensor& cache = kv_caches[layer];
    check_cache(cache, ("layer " + std::to_string(layer) + ": kv_cache").c_str());
    for (int64_t i = 0; i < 2 * n; ++i)
      TORCH_CHECK(ids[i] >= 0 && ids[i] < cache.size(1), "paged_cpu: block pair (", ids[i / 2 * 2], ", ",
                  ids[i / 2 * 2 + 1], ") out of range for ", cache.size(1), " blocks in layer ", layer);
  }
  // The pairs are independent (no destination is a source), so all copies may run in parallel.
  const auto layers = static_cast<int64_t>(kv_caches.size());
  at::parallel_for(0, layers * n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const at::Tensor& cache = kv_caches[i / n];
      const int64_t esize = cache.element_size(), block_bytes = cache.stride(1) * esize;
      const int64_t plane = cache.stride(0) * esize;
      auto* base = static_cast<char*>(cache.data_ptr());
      const int64_t src = ids[2 * (i % n)], dst = ids[2 * (i % n) + 1];
      std::memcpy(base + dst * block_bytes, base + src * block_bytes, block_bytes);
      std::memcpy(base + plane + dst * block_bytes, base + plane + src * block_bytes, block_bytes);
    }
  });
}

}  // namespace paged_cpu
