// The interface between the torch-facing layer ops (fused_ops.cpp) and their per-ISA kernels.
//
// Like kernel_api.h, no torch headers: the kernel translation units are compiled for their own
// instruction sets. All arithmetic is fp32; inputs and outputs are fp32, bf16 or fp16, converted
// on load and rounded once on store.
#pragma once

#include <cstdint>

namespace paged_cpu {

// Storage type of an input or output.
enum class Elem : int32_t { F32 = 0, BF16 = 1, F16 = 2 };

// rms_norm and add_rms_norm over rows [begin, end) of a [T, H] input.
struct RmsArgs {
  const void* x;          // row t at x + t * x_stride elements, unit stride within a row
  int64_t x_stride;
  const void* residual;   // add_rms_norm only (nullptr for rms_norm); same type as x
  int64_t r_stride;
  Elem type;              // of x, residual and both outputs
  const void* weight;     // [H], contiguous
  Elem w_type;
  int64_t hidden;
  float eps;
  void* out;              // [T, H] contiguous: the normalised rows
  void* sum;              // [T, H] contiguous: x + residual (add_rms_norm only)
};

// silu(x[:, :I]) * x[:, I:] over rows [begin, end).
struct SiluArgs {
  const void* x;          // [T, 2I], unit stride within a row
  int64_t x_stride;
  Elem type;              // of x and out
  int64_t inter;          // I
  void* out;              // [T, I] contiguous
};

// NeoX rotary of one of query / key: [T, heads, D] with arbitrary token and head strides.
struct RotaryTensor {
  const void* src;
  int64_t token_stride;
  int64_t head_stride;
  Elem type;
  int64_t heads;
  void* dst;              // [T, heads, D] contiguous, same type
};

struct RotaryArgs {
  const int64_t* positions;  // [T], already checked against the cache length
  const void* cache;         // [max_pos, D]: cos halves then sin halves; row p at cache + p * cache_stride
  int64_t cache_stride;
  Elem cache_type;
  int64_t head_size;         // D (even)
  RotaryTensor q, k;
};

// rotate_heads: each D-vector of [T, heads, D] times the block-diagonal normalised Hadamard matrix R(D), by the
// fast Walsh-Hadamard butterfly (fused_body.h, hadamard_rows): the order paged_core's reference follows.
struct HadamardArgs {
  const void* src;        // [T, heads, D], arbitrary token and head strides, unit stride within a vector
  int64_t token_stride;
  int64_t head_stride;
  Elem type;              // of src and dst
  int64_t heads;
  int64_t head_size;      // D
  int64_t block;          // b: the largest power of two dividing D
  float scale;            // float32(1 / sqrt(b)), computed in double
  void* dst;              // [T, heads, D] contiguous
};

// Linear layers read weights packed once at load into panels of 16 output features:
// packed [ceil(N / 16), K, 16], panel p row k = features 16p .. 16p+15 at input k, zero past N.
// fp32 and fp16 panels hold the 16 features in order. bf16 panels interleave the two halves, so
// one 32-bit word holds features j (low 16 bits) and 8 + j (high): shifting a word left by 16 gives
// feature j in fp32 and masking off its low half gives feature 8 + j, with no shuffles.
constexpr int kPanel = 16;

struct LinearArgs {
  const float* x;         // [M, K] fp32, row stride ldx
  int64_t ldx;
  int64_t rows;           // M
  int64_t in_features;    // K
  const void* w;          // packed panels
  Elem w_type;
  const float* bias;      // [N] fp32 or nullptr
  int64_t out_features;   // N
  void* out;              // [M, N] contiguous
  Elem out_type;
};

// Linear layers over packed weights read in place (paged_core.quant's formats, unchanged bytes):
// data row n at w + n * ldw bytes, K / block blocks of the format's bytes each (int8: K int8 values,
// with an fp32 scale per row). The ids are the op's `fmt` argument (paged_backend_cpu.ops.QUANT_FORMATS).
enum class QFormat : int32_t { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, Q4_K = 3, Q6_K = 4, INT8 = 5 };
constexpr int kQuantFormats = 6;

// The interleaved q4 layout (quant_x8_body.h): bytes per block of 32 weights of a group of 8 rows, its 8 fp16
// scales (q4_1: and 8 fp16 mins) then 128 bytes of nibbles. One definition for the kernel and the op's check.
constexpr int x8_scale_bytes(bool with_min) { return with_min ? 32 : 16; }
constexpr int x8_block_bytes(bool with_min) { return x8_scale_bytes(with_min) + 128; }

struct QuantFormatInfo {
  const char* name;
  int block;  // input features per block
  int bytes;  // bytes per block
};

constexpr QuantFormatInfo kQuantFormatInfo[kQuantFormats] = {
    {"q4_0", 32, 18}, {"q4_1", 32, 20}, {"q8_0", 32, 34}, {"q4_k", 256, 144}, {"q6_k", 256, 210}, {"int8", 1, 1},
};

// Output features a streaming call handles as one unit (a multiple of every register tile's width).
constexpr int kQuantGroup = 12;

struct QuantArgs {
  const float* x;         // [M, K] fp32, row stride ldx
  int64_t ldx;
  int64_t rows;           // M
  int64_t in_features;    // K
  const uint8_t* w;       // packed rows
  int64_t ldw;            // bytes from one packed row to the next
  QFormat format;
  const float* scale;     // int8: [N] per-row scales; else nullptr
  const float* bias;      // [N] fp32 or nullptr
  int64_t out_features;   // N
  void* out;              // [M, N] contiguous
  Elem out_type;
  int64_t chunk;          // dequantize path: output features dequantized into one fp32 scratch at a time
  // Q8Kernels::stream only: x rounded to int8 per 32-wide block (quant_q8_body.h), [M, K] contiguous, with each
  // block's scale d and d * sum(q) side by side, [M, K / 32, 2].
  const int8_t* xq;
  const float* xds;
};

// Output features [begin, end) of every row. `stream` reads each packed row once per tile of up to 4
// rows of x, dequantizing in registers (decode, few rows); `dequant_dot` dequantizes `chunk` rows at
// a time into an fp32 scratch and multiplies every row of x against it (prefill, many rows).
using QuantFn = void (*)(const QuantArgs&, int64_t begin, int64_t end);

struct QuantKernels {
  const char* name;
  QuantFn stream;
  QuantFn dequant_dot;
  const struct Q8Kernels* q8;  // the int8-activation path of this build (nullptr: none of its own)
};

// The int8-activation path (quant_q8_body.h): `round` rounds rows of x [rows, k] (fp32, row stride ldx) into
// xq [rows, k] and the per-block scales d and d * sum(q), side by side in xds [rows, k / 32, 2]; `stream` is
// QuantKernels::stream over them (a.xq, a.xds), for q4_0 and q4_1 only.
using Q8RoundFn = void (*)(const float* x, int64_t ldx, int64_t rows, int64_t k, int8_t* xq, float* xds);
struct Q8Kernels {
  const char* name;
  Q8RoundFn round;
  QuantFn stream;
  // `stream` over q4_0 / q4_1 rows interleaved in groups of 8 (quant_x8_body.h; a.w the interleaved copy,
  // features [begin, end) multiples of 8); nullptr where the build has none.
  QuantFn stream_x8;
};

const QuantKernels* scalar_quant_kernels();
const QuantKernels* avx2_quant_kernels();  // nullptr when not built (non-x86 or not GCC)
const QuantKernels* avx512_quant_kernels();  // likewise
// The q8 path with AVX-512 VNNI dot products on 256-bit vectors; nullptr when not built or the CPU lacks it.
const Q8Kernels* vnni_q8_kernels();
// The avx2 build's exact paths compiled with AVX-512VL's 32 registers (same bits, wider tiles); nullptr likewise.
const QuantKernels* avx2_vl_quant_kernels();
// Q8Kernels::stream_x8 on AMX tiles for rows [0, a.rows), a.rows a multiple of 16, with the same bits
// (quant_amx.cpp); nullptr where the build, the CPU or the OS (or PAGED_CPU_AMX=0) says no.
QuantFn amx_x8_stream();

using RmsFn = void (*)(const RmsArgs&, int64_t begin, int64_t end);
using SiluFn = void (*)(const SiluArgs&, int64_t begin, int64_t end);
using RotaryFn = void (*)(const RotaryArgs&, int64_t begin, int64_t end);
using LinearFn = void (*)(const LinearArgs&, int64_t panel_begin, int64_t panel_end);
using HadamardFn = void (*)(const HadamardArgs&, int64_t begin, int64_t end);

// One instruction-set variant of the layer kernels.
struct FusedKernels {
  const char* name;
  RmsFn rms_norm;        // also add_rms_norm (RmsArgs::residual set)
  SiluFn silu_and_mul;
  RotaryFn rotary;
  LinearFn linear;
  HadamardFn rotate_heads;  // tokens [begin, end)
};

const FusedKernels* scalar_fused_kernels();
const FusedKernels* avx2_fused_kernels();  // nullptr when not built (non-x86 or not GCC)

}  // namespace paged_cpu
