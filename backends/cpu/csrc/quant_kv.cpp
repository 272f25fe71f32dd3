// write_kv for int8 / float8 caches: per token-head float16 scales, elements rounded as torch rounds them.
#include "quant_kv.h"

#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>

#include "ops.h"

namespace paged_cpu {
namespace {

constexpr float kMinScale = 5.9604644775390625e-08f;  // 2**-24, the smallest float16
constexpr float kMaxScale = 65504.0f;                 // the largest float16

constexpr float qmax_of(KvType k) { return k == KvType::I8 ? 127.0f : (k == KvType::E4M3 ? 448.0f : 57344.0f); }

// One clamped, scaled element in the cache's byte (c10's conversions are the ones torch's casts use).
template <KvType K>
inline uint8_t quantize_one(float q) {
  if constexpr (K == KvType::I8) return static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(q)));
  if constexpr (K == KvType::E4M3) return c10::Float8_e4m3fn(q).x;
  return c10::Float8_e5m2(q).x;
}

// Quantizes the D floats at x, handing byte i to put(i, byte); returns the float16 bits of the scale.
template <KvType K, typename Put>
inline uint16_t quantize_vector(const float* x, int64_t d, const Put& put) {
  constexpr float qmax = qmax_of(K);
  float amax = 0.0f;
  for (int64_t i = 0; i < d; ++i) {
    const float a = std::fabs(x[i]);
    amax = (a > amax || std::isnan(a)) ? a : amax;  // NaN propagates, as torch's amax
  }
  float ratio = amax / qmax;
  ratio = ratio < kMinScale ? kMinScale : (ratio > kMaxScale ? kMaxScale : ratio);
  const c10::Half scale(ratio);
  const float s = static_cast<float>(scale);
  for (int64_t i = 0; i < d; ++i) {
    float q = x[i] / s;  // a division, as the reference divides (not a multiply by 1 / s)
    q = q < -qmax ? -qmax : (q > qmax ? qmax : q);
    put(i, quantize_one<K>(q));
  }
  return scale.x;
}

template <KvType K>
void write_rows(const at::Tensor& k, const at::Tensor& v, const at::Tensor& cache, const int64_t* slot) {
  const int64_t tokens = k.size(0), kv_heads = k.size(1), d = k.size(2), block_size = cache.size(3);
  auto* base = static_cast<uint8_t*>(cache.data_ptr());
  const int64_t plane = cache.stride(0), block_bytes = cache.stride(1), tile_bytes = cache.stride(2);
  const int64_t scale_row = block_size * d;  // the tile's float16 scales follow its data bytes
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;  // padding: never written
      const int64_t block = slot[t] / block_size, off = slot[t] % block_size;
      for (int64_t h = 0; h < kv_heads; ++h) {
        uint8_t* tile = base + block * block_bytes + h * tile_bytes;
        // Key dimension i of this slot: pair i / 2, lane (off, i % 2) of the pair layout.
        const uint16_t ks = quantize_vector<K>(kp + t * k.stride(0) + h * k.stride(1), d, [&](int64_t i, uint8_t b) {
          tile[(i / 2 * block_size + off) * 2 + i % 2] = b;
        });
        uint8_t* vrow = tile + plane + off * d;
        const uint16_t vs = quantize_vector<K>(vp + t * v.stride(0) + h * v.stride(1), d,
                                               [&](int64_t i, uint8_t b) { vrow[i] = b; });
        std::memcpy(tile + scale_row + 2 * off, &ks, 2);
        std::memcpy(tile + plane + scale_row + 2 * off, &vs, 2);
      }
    }
  });
}

// fp32 rows with unit stride along D.
at::Tensor float_rows(const at::Tensor& x) {
  at::Tensor t = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  return t.stride(2) == 1 ? t : t.contiguous();
}

}  // namespace

void write_kv_quantized(const at::Tensor& key, const at::Tensor& value, const at::Tensor& kv_cache,
                        const int64_t* slot) {
  const at::Tensor k = float_rows(key), v = float_rows(value);
  switch (kv_type_of(kv_cache)) {
    case KvType::I8: return write_rows<KvType::I8>(k, v, kv_cache, slot);
    case KvType::E4M3: return write_rows<KvType::E4M3>(k, v, kv_cache, slot);
    case KvType::E5M2: return write_rows<KvType::E5M2>(k, v, kv_cache, slot);
    default: TORCH_CHECK(false, "paged_cpu: write_kv_quantized on a cache of ", kv_cache.scalar_type());
  }
}

}  // namespace paged_cpu
