// The interleaved q4 path (quant_x8_body.h) on AMX tiles, for 16 rows of x at a time: the integer products of a
// block of 32 weights by one TDPBSUD (16 rows x 16 features), the fp32 rule of quant_x8_body.h after it.
//
// Why: on a CPU with AMX-INT8 (Sapphire Rapids and later) one tile instruction does the 8,192 byte products of
// 16 rows x 16 features x 32 weights; the VNNI tiles do 32 per instruction. What is left per block is the
// per-block fp32 arithmetic (the GGUF scales differ per block of 32), on 16-lane vectors.
//
// Same bits as quant_x8_body.h: the integer sum of a block is exact either way, and the fp32 steps per output
// and block are the same operations in the same order:
//   acc = fma(float(isum_b), d_b * da_b, acc);  acc = fma(m_b, da_b * sum(qa_b), acc)
// so a row's result does not depend on which of the two kernels served it (batch invariance).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fused_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,amx-tile,amx-int8")
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace amx_quant {

#include "fused_body.h"

constexpr int kRows = 16;  // rows of x per tile, features per slab
constexpr int64_t kRowBlock = 128;

// The tile registers, two blocks in flight: 0 / 3 activations (16 rows x 32 bytes), 1 / 4 weights (8 rows of
// 16 features x 4 bytes), 2 / 5 sums (16 x 16 int32).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {32, 64, 64, 32, 64, 64};
  uint8_t rows[16] = {16, 8, 16, 16, 8, 16};
};

// Per block of a slab of 16 features: the weight tile (rows 0-3 low nibbles, 4-7 high nibbles of the
// interleaved vectors, features 0-7 from the first group and 8-15 from the second), then d and m as fp32.
constexpr int kTileBytes = 512, kSlabBlockBytes = kTileBytes + 2 * 16 * 4;

template <bool kMin>
void unpack_slab(const QuantArgs& a, const uint8_t* group0, const uint8_t* group1, int64_t blocks, uint8_t* dst) {
  constexpr int kScaleBytes = x8_scale_bytes(kMin), kBlockBytes = x8_block_bytes(kMin);
  const __m512i low = _mm512_set1_epi8(15);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* b0 = group0 + blk * kBlockBytes;
    const uint8_t* b1 = group1 != nullptr ? group1 + blk * kBlockBytes : nullptr;
    uint8_t* out = dst + blk * kSlabBlockBytes;
    for (int g = 0; g < 4; ++g) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + kScaleBytes + 32 * g));
      const __m256i v1 = b1 != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + kScaleBytes + 32 * g))
                                       : _mm256_setzero_si256();
      const __m512i z = _mm512_inserti64x4(_mm512_zextsi256_si512(v0), v1, 1);
      _mm512_storeu_si512(out + 64 * g, _mm512_and_si512(z, low));
      _mm512_storeu_si512(out + 64 * (4 + g), _mm512_and_si512(_mm512_srli_epi16(z, 4), low));
    }
    const __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0));
    const __m128i h1 = b1 != nullptr ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1)) : _mm_setzero_si128();
    const __m512 d = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_zextsi128_si256(h0), h1, 1));
    __m512 m;
    if constexpr (kMin) {
      const __m128i m0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 16));
      const __m128i m1 = b1 != nullptr ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + 16)) : _mm_setzero_si128();
      m = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_zextsi128_si256(m0), m1, 1));
    } else {
      m = _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));  // q4_0: d * q - 8d, as quant_x8_body.h
    }
    _mm512_storeu_ps(reinterpret_cast<float*>(out + kTileBytes), d);
    _mm512_storeu_ps(reinterpret_cast<float*>(out + kTileBytes + 64), m);
  }
}

template <Elem E>
void store_rows(const QuantArgs& a, const __m512* acc, int nf, int64_t r0, int64_t n0) {
  Store<E>* out = static_cast<Store<E>*>(a.out) + r0 * a.out_features + n0;
  alignas(64) float v[16];
  for (int r = 0; r < kRows; ++r) {
    _mm512_store_ps(v, acc[r]);
    for (int f = 0; f < nf; ++f)
      out[r * a.out_features + f] = round_to<E>(v[f] + (a.bias != nullptr ? a.bias[n0 + f] : 0.0f));
  }
}

// Rows [0, a.rows) (a multiple of 16) by features [begin, end) (multiples of 8) from the interleaved copy a.w.
template <bool kMin>
void amx_stream(const QuantArgs& a, int64_t begin, int64_t end) {
  const int64_t k = a.in_features, blocks = k / 32;
  const int64_t group_bytes = blocks * x8_block_bytes(kMin);
  thread_local std::vector<uint8_t> slab;
  if (slab.size() < static_cast<size_t>(blocks * kSlabBlockBytes + 64)) slab.resize(blocks * kSlabBlockBytes + 64);
  uint8_t* sb = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(slab.data()) + 63) & ~uintptr_t{63});
  const TileConfig config;
  _tile_loadconfig(&config);
  alignas(64) int32_t sums[2 * kRows * 16];
  // Blocks of kRowBlock rows outside, slabs inside: the block's rounded rows stay in L2 while every slab passes,
  // and its outputs are written row by row (slabs outside measured 2-3x slower from 1,024 rows of 3,072 outputs
  // on: each slab's 64-byte column strip of a large output touches a new page per row). A slab is unpacked
  // again per block (a few per cent of the block's work).
  for (int64_t rb = 0; rb < a.rows; rb += kRowBlock)
  for (int64_t n0 = begin; n0 < end; n0 += 16) {
    const int nf = static_cast<int>(std::min<int64_t>(16, end - n0));
    const uint8_t* g0 = a.w + n0 / 8 * group_bytes;
    unpack_slab<kMin>(a, g0, nf > 8 ? g0 + group_bytes : nullptr, blocks, sb);
    for (int64_t r0 = rb; r0 < std::min(a.rows, rb + kRowBlock); r0 += kRows) {
      __m512 acc[kRows];
      for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
      const int8_t* xq = a.xq + r0 * k;
      const float* ds = a.xds + 2 * r0 * blocks;
      // The fp32 steps of one block, in block order (quant_x8_body.h's rule).
      auto scale = [&](int64_t blk, const int32_t* sum) {
        const uint8_t* wb = sb + blk * kSlabBlockBytes;
        const __m512 d = _mm512_load_ps(reinterpret_cast<const float*>(wb + kTileBytes));
        const __m512 m = _mm512_load_ps(reinterpret_cast<const float*>(wb + kTileBytes + 64));
        for (int r = 0; r < kRows; ++r) {
          const float* s = ds + 2 * (r * blocks + blk);  // (da, da * sum(qa))
          const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(sum + 16 * r));
          acc[r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(s[0])), acc[r]);
          acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(s[1]), acc[r]);
        }
      };
      // Software-pipelined: block b + 1's tile product (tiles 3-5 or 0-2, alternately) is issued before block b's
      // fp32 steps, which read the sums stored the iteration before; the fp32 steps stay in block order.
      auto product = [&](int64_t blk) {
        int32_t* out = sums + (blk & 1) * kRows * 16;
        if ((blk & 1) == 0) {
          _tile_loadd(0, xq + 32 * blk, k);
          _tile_loadd(1, sb + blk * kSlabBlockBytes, 64);
          _tile_zero(2);
          _tile_dpbsud(2, 0, 1);
          _tile_stored(2, out, 64);
        } else {
          _tile_loadd(3, xq + 32 * blk, k);
          _tile_loadd(4, sb + blk * kSlabBlockBytes, 64);
          _tile_zero(5);
          _tile_dpbsud(5, 3, 4);
          _tile_stored(5, out, 64);
        }
      };
      product(0);
      for (int64_t blk = 0; blk < blocks; ++blk) {
        if (blk + 1 < blocks) product(blk + 1);
        scale(blk, sums + (blk & 1) * kRows * 16);
      }
      switch (a.out_type) {
        case Elem::F32: store_rows<Elem::F32>(a, acc, nf, r0, n0); break;
        case Elem::BF16: store_rows<Elem::BF16>(a, acc, nf, r0, n0); break;
        case Elem::F16: store_rows<Elem::F16>(a, acc, nf, r0, n0); break;
      }
    }
  }
  _tile_release();
}

void amx_stream_x8(const QuantArgs& a, int64_t begin, int64_t end) {
  if (a.format == QFormat::Q4_1) amx_stream<true>(a, begin, end);
  else amx_stream<false>(a, begin, end);
}

}  // namespace amx_quant
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
namespace {
// The CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24, 25), and Linux lets this process use the tile
// data state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; once per process, for every thread).
bool amx_usable() {
  const char* env = std::getenv("PAGED_CPU_AMX");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  if (((edx >> 24) & 1u) == 0 || ((edx >> 25) & 1u) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
}  // namespace

QuantFn amx_x8_stream() {
  static const bool usable = amx_usable();
  return usable ? &amx_quant::amx_stream_x8 : nullptr;
}
}  // namespace paged_cpu
#else
namespace paged_cpu {
QuantFn amx_x8_stream() { return nullptr; }
}  // namespace paged_cpu
#endif
