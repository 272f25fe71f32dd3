// The interface between the torch-facing op layer (ops.cpp) and the per-ISA kernels.
//
// Kernel translation units include no torch headers: each one is compiled for
// its own instruction set, and an inline torch function emitted there could be
// picked by the linker for the whole library and then run on a CPU without it.
#pragma once

#include <cstdint>

namespace paged_cpu {

// Storage type of the KV cache. I8, E4M3 and E5M2 are quantized: int8, float8_e4m3fn, float8_e5m2 elements,
// each vector (one token, one KV head) with its own float16 scale (the rule of paged_core's kv_quant).
enum class KvType : int32_t { F32 = 0, BF16 = 1, F16 = 2, I8 = 3, E4M3 = 4, E5M2 = 5 };

constexpr bool is_quantized(KvType k) { return k == KvType::I8 || k == KvType::E4M3 || k == KvType::E5M2; }

// Bytes per stored element.
constexpr int kv_elem_bytes(KvType k) { return k == KvType::F32 ? 4 : (is_quantized(k) ? 1 : 2); }

// The kernels read a quantized element as a float that is its value times this (exact: a power of two).
// E4M3 bytes are widened into float16 bits without rebiasing the exponent (see stage_pairs), which
// divides every value by 2**8; the vector's scale is multiplied back by it.
constexpr float staged_unit(KvType k) { return k == KvType::E4M3 ? 256.0f : 1.0f; }

// The cache layout (one tensor [2, num_blocks, kv_heads, block_size, head_size] per layer).
// Each block holds, per KV head, a [block_size, head_size] tile of keys and one of values. Values are
// stored as the shape says. Keys are stored with dimension pairs outermost: key j's dimensions
// (2i, 2i+1) sit at tile offset (i * block_size + j) * 2, so one 64-byte line holds dimension pair i
// of 16 consecutive keys (bf16): a dot-product instruction on it scores 16 keys at once, with no
// horizontal sums, and each key line serves every query row of a GQA group.
//
// Quantized caches are [2, num_blocks, kv_heads, block_size, head_size + 2] of 1-byte elements (the
// default shape of paged_core's kv_quant rule, so the KV budget counts 2 more bytes per vector), but a
// tile's block_size * (head_size + 2) bytes hold the block_size * head_size data bytes first, in the
// layouts above (keys in pairs, values row-major), then the block_size float16 scales of its vectors in
// slot order: one 32-byte load gives a 16-key group's scales, and a block copy carries its scales.
constexpr int kKeyGroup = 16;  // keys scored together; every block size is a multiple of it
constexpr int kMaxItemHeads = 4;  // KV heads one work item may cover

// One attention call: fp32 queries/outputs plus a paged KV cache in any KvType.
struct AttnProblem {
  const float* q;            // [T, H, D] contiguous
  float* out;                // [T, H, D] contiguous
  const void* k_cache;       // key plane [num_blocks, KVH, block_size, D], tiles in pair layout
  const void* v_cache;       // value plane, same shape, tiles row-major
  KvType kv_type;
  int64_t block_stride;      // elements from one block to the next (KVH * block_size * D)
  int64_t head_stride;       // elements from one KV head's tile to the next (block_size * D)
  const int32_t* block_table;
  int64_t table_stride;      // elements between block-table rows
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_size;
  int32_t block_size;
  float scale;
  bool bf16_query;           // queries were bf16: bf16 dot products lose nothing on them
  int32_t sliding_window;    // > 0: key j is visible from position i iff i - sliding_window < j <= i
  float soft_cap;            // > 0: each scaled score s becomes soft_cap * tanh(s / soft_cap)
};

// A tile of query tokens of one row and a range of KV heads against a range of its keys.
// Rows of the item are head-major: row r is KV head kv_head + r / (q_count * group), token
// q_start + (r / group) % q_count, query head (kv_head + r / (q_count * group)) * group + r % group.
struct WorkItem {
  int32_t row;        // batch row (selects the block-table row)
  int32_t kv_head;    // first KV head
  int32_t kv_count;   // KV heads in the item (at most kMaxItemHeads)
  int32_t q_start;    // first token index of the tile
  int32_t q_count;    // tokens in the tile
  int32_t first_pos;  // absolute position of the tile's first token
  int32_t k_begin;    // keys [k_begin, k_end) of this item; k_begin is a multiple of kKeyGroup
  int32_t k_end;      // (chunks of keys end at multiples of chunk_tokens, the same for every item)
  int64_t partial;    // -1: write normalised output; else float offset of this item's partial record
};

// A partial record for M = kv_count * q_count * group rows: max[M], sum[M], unnormalised acc[M * D].
inline int64_t partial_floats(int64_t rows, int64_t head_size) { return rows * (head_size + 2); }

// Keys processed per inner chunk: one chunk's staged keys and values stay in L1/L2.
constexpr int kMaxChunk = 128;
inline int32_t chunk_tokens(int32_t head_size) { return head_size > 128 ? kMaxChunk / 2 : kMaxChunk; }

// Scratch floats one item needs (query tile fp32 + bf16, scores, staged K and V, accumulators).
inline int64_t workspace_floats(int64_t rows, int64_t head_size) {
  const int64_t ch = chunk_tokens(static_cast<int32_t>(head_size));
  return rows * head_size * 2 + rows * ch + 2 * ch * head_size + rows * (head_size + 2) + 64;
}

using AttendFn = void (*)(const AttnProblem&, const WorkItem&, float* workspace, float* partials);

// One instruction-set variant of the kernels.
struct IsaKernels {
  const char* name;
  AttendFn attend;
};

const IsaKernels* scalar_kernels();
const IsaKernels* avx2_kernels();          // nullptr when not built (non-x86)
const IsaKernels* avx512_kernels();        // nullptr when not built (non-x86)
const IsaKernels* avx512bf16_kernels();    // nullptr when not built (non-x86)

}  // namespace paged_cpu
