// Paged attention: one algorithm for decode and prefill rows.
//
// A thread block takes a tile of R query rows of one batch row, where the query rows are that row's new tokens
// times the query heads of ONE KV head (row r = token * group + head-in-group), so every key and value it
// loads serves the whole GQA group. Four warps walk the tile's visible keys (causal, and inside the sliding
// window) through the block table in interleaved chunks of KCH keys; each lane owns E consecutive elements of
// the head dimension, so a key row is one coalesced vector load per lane and a score is one warp sum. Each
// warp keeps an online softmax (running max, sum, fp32 accumulator); the warps merge through shared memory.
// Long contexts split into `num_splits` key ranges (grid z), written as partials that `reduce_kernel`
// combines. Every grid size comes from host ints, never from tensor values, so a launch captures in a graph.
#include <cfloat>

#include "common.cuh"
#include "launch.h"

namespace paged_cuda {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <int D>
struct HeadLayout {
  static constexpr int kElems = D <= 64 ? 2 : (D <= 128 ? 4 : 8);  // head elements per lane
  static constexpr int kLanes = D / kElems;                          // lanes that hold elements
  static_assert(D % kElems == 0 && kLanes <= 32, "head size must split over one warp");
};

// Keys per warp step: enough independent loads in flight, but two where a lane's slice is wider than 16 bytes
// or eight rows of eight elements already fill the registers (four spilled there).
template <typename T, int D, int R>
struct KeysPerStep {
  static constexpr int kElems = HeadLayout<D>::kElems;
  static constexpr int value = (kElems * sizeof(T) > 16 || R * kElems >= 64) ? 2 : 4;
};

template <typename T, int D, int R>
__global__ void __launch_bounds__(kThreads, 2) attention_kernel(const AttentionArgs a) {
  constexpr int E = HeadLayout<D>::kElems;
  constexpr int KCH = KeysPerStep<T, D, R>::value;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool holds = lane < HeadLayout<D>::kLanes;

  const int b = a.first_row + blockIdx.y;
  const int q_begin = a.query_start_loc[b];
  const int q_len = a.query_start_loc[b + 1] - q_begin;
  const int group = a.num_heads / a.num_kv_heads;
  const int r0 = blockIdx.x * R;
  if (q_len <= 0 || r0 >= q_len * group) return;  // an empty (padding) row, or a tile past this row's end
  const int kv_head = blockIdx.z % a.num_kv_heads;
  const int split = blockIdx.z / a.num_kv_heads;
  const int context = a.seq_lens[b] - q_len;

  // This tile's query rows: token, head and absolute position of each.
  int pos[R], head[R], token[R];
  bool valid[R];
#pragma unroll
  for (int m = 0; m < R; ++m) {
    const int r = r0 + m;
    valid[m] = r < q_len * group;
    token[m] = q_begin + (valid[m] ? r / group : 0);
    head[m] = kv_head * group + (valid[m] ? r % group : 0);
    pos[m] = context + (valid[m] ? r / group : 0);
  }
  const int last_row = min(r0 + R, q_len * group) - 1;
  int hi = context + last_row / group + 1;  // keys [lo, hi): causal bound of the tile's last token
  int lo = a.window > 0 ? max(0, context + r0 / group - a.window + 1) : 0;
  if (a.num_splits > 1) {
    lo = max(lo, split * a.split_keys);
    hi = min(hi, (split + 1) * a.split_keys);
  }

  // Queries in registers, pre-scaled.
  float q[R][E];
#pragma unroll
  for (int m = 0; m < R; ++m) {
    const T* src = static_cast<const T*>(a.query) + token[m] * a.q_stride_token + head[m] * a.q_stride_head;
#pragma unroll
    for (int e = 0; e < E; ++e) q[m][e] = (valid[m] && holds) ? to_float(src[lane * E + e]) * a.scale : 0.f;
  }

  float run_max[R], run_sum[R], acc[R][E];
#pragma unroll
  for (int m = 0; m < R; ++m) {
    run_max[m] = -FLT_MAX;
    run_sum[m] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[m][e] = 0.f;
  }

  const T* k_cache = static_cast<const T*>(a.key_cache);
  const T* v_cache = static_cast<const T*>(a.value_cache);
  const int32_t* table = a.block_table + static_cast<int64_t>(b) * a.table_width;
  // Keys and values travel as raw vectors: the next step's are loaded (block-table read included) before this
  // step's math, so every warp keeps its next loads in flight while it computes.
  Vec<T, E> k_raw[KCH], v_raw[KCH];
  auto fetch = [&](int j0) {
#pragma unroll
    for (int c = 0; c < KCH; ++c) {
      const int j = j0 + c;
      if (j < hi && holds) {
        const int64_t blk = table[j / a.block_size];
        const int64_t at = ((blk * a.block_size + j % a.block_size) * a.num_kv_heads + kv_head) * D + lane * E;
        k_raw[c] = *reinterpret_cast<const Vec<T, E>*>(k_cache + at);
        v_raw[c] = *reinterpret_cast<const Vec<T, E>*>(v_cache + at);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) k_raw[c].v[e] = v_raw[c].v[e] = from_float<T>(0.f);
      }
    }
  };
  fetch(lo + warp * KCH);
  for (int j0 = lo + warp * KCH; j0 < hi; j0 += kWarps * KCH) {
    float kf[KCH][E], vf[KCH][E];
#pragma unroll
    for (int c = 0; c < KCH; ++c) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kf[c][e] = to_float(k_raw[c].v[e]);
        vf[c][e] = to_float(v_raw[c].v[e]);
      }
    }
    fetch(j0 + kWarps * KCH);
#pragma unroll
    for (int m = 0; m < R; ++m) {
      float s[KCH];
      float step_max = run_max[m];
#pragma unroll
      for (int c = 0; c < KCH; ++c) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(q[m][e], kf[c][e], dot);
        dot = warp_sum(dot);
        if (a.soft_cap > 0.f) dot = a.soft_cap * tanhf(dot / a.soft_cap);
        const int j = j0 + c;
        const bool visible = valid[m] && j < hi && j <= pos[m] && (a.window <= 0 || j > pos[m] - a.window);
        s[c] = visible ? dot : -FLT_MAX;
        step_max = fmaxf(step_max, s[c]);
      }
      if (step_max == -FLT_MAX) continue;  // nothing visible to this row in this step
      const float alpha = __expf(run_max[m] - step_max);
      float p_sum = 0.f;
#pragma unroll
      for (int c = 0; c < KCH; ++c) {
        s[c] = s[c] == -FLT_MAX ? 0.f : __expf(s[c] - step_max);
        p_sum += s[c];
      }
      run_sum[m] = run_sum[m] * alpha + p_sum;
      run_max[m] = step_max;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        float v = acc[m][e] * alpha;
#pragma unroll
        for (int c = 0; c < KCH; ++c) v = fmaf(s[c], vf[c][e], v);
        acc[m][e] = v;
      }
    }
  }

  // Merge the warps' softmax states.
  __shared__ float s_max[kWarps][R], s_sum[kWarps][R];
  __shared__ float s_acc[kWarps][R][D];
#pragma unroll
  for (int m = 0; m < R; ++m) {
    if (lane == 0) {
      s_max[warp][m] = run_max[m];
      s_sum[warp][m] = run_sum[m];
    }
    if (holds) {
#pragma unroll
      for (int e = 0; e < E; ++e) s_acc[warp][m][lane * E + e] = acc[m][e];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < R * D; idx += kThreads) {
    const int m = idx / D, d = idx - m * D;
    const int r = r0 + m;
    if (r >= q_len * group) continue;
    const int tok = q_begin + r / group, h = kv_head * group + r % group;
    float top = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, s_max[w][m]);
    float num = 0.f, den = 0.f;
    if (top != -FLT_MAX) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = s_sum[w][m] > 0.f ? __expf(s_max[w][m] - top) : 0.f;
        num = fmaf(f, s_acc[w][m][d], num);
        den = fmaf(f, s_sum[w][m], den);
      }
    }
    const float o = den > 0.f ? num / den : 0.f;
    const int64_t th = static_cast<int64_t>(tok) * a.num_heads + h;
    if (a.num_splits > 1) {
      const int64_t part = th * a.num_splits + split;
      a.partial_out[part * D + d] = o;
      if (d == 0) {
        a.partial_max[part] = top;
        a.partial_sum[part] = den;
      }
    } else {
      static_cast<T*>(a.out)[th * D + d] = from_float<T>(o);
    }
  }
}

// Combines the splits of each (token, head): weights exp(max_s - max) * sum_s over normalised partials.
template <typename OT>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const AttentionArgs a) {
  const int64_t th = static_cast<int64_t>(blockIdx.x) * a.num_heads + blockIdx.y;
  const int S = a.num_splits, D = a.head_size;
  const float* pmax = a.partial_max + th * S;
  const float* psum = a.partial_sum + th * S;
  float top = -FLT_MAX;
  for (int s = 0; s < S; ++s)
    if (psum[s] > 0.f) top = fmaxf(top, pmax[s]);
  float den = 0.f;
  for (int s = 0; s < S; ++s) den += psum[s] > 0.f ? __expf(pmax[s] - top) * psum[s] : 0.f;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float num = 0.f;
    for (int s = 0; s < S; ++s)
      if (psum[s] > 0.f) num = fmaf(__expf(pmax[s] - top) * psum[s], a.partial_out[(th * S + s) * D + d], num);
    static_cast<OT*>(a.out)[th * D + d] = from_float<OT>(den > 0.f ? num / den : 0.f);
  }
}

// ---- dispatch -------------------------------------------------------------------------------------------

template <typename T, int D, int R>
static const char* launch_typed(const AttentionArgs& a, cudaStream_t stream) {
  const int group = a.num_heads / a.num_kv_heads;
  const int64_t tiles = (static_cast<int64_t>(a.max_query_len) * group + R - 1) / R;
  const int64_t z = static_cast<int64_t>(a.num_kv_heads) * a.num_splits;
  if (a.num_rows > 65535 || z > 65535 || tiles > 0x7fffffff) return "attention: grid too large";
  PAGED_LAUNCH(dim3(static_cast<unsigned>(tiles), a.num_rows, static_cast<unsigned>(z)), kThreads, stream,
               attention_kernel<T, D, R>)(a);
  return nullptr;
}

template <typename T, int D>
static const char* by_rows(const AttentionArgs& a, cudaStream_t s) {
  switch (a.rows_per_tile) {
    case 1: return launch_typed<T, D, 1>(a, s);
    case 4: return launch_typed<T, D, 4>(a, s);
    case 8: return launch_typed<T, D, 8>(a, s);
  }
  return "attention: rows_per_tile must be 1, 4 or 8";
}

template <typename T>
static const char* by_head(const AttentionArgs& a, cudaStream_t s) {
  switch (a.head_size) {
    case 64: return by_rows<T, 64>(a, s);
    case 80: return by_rows<T, 80>(a, s);
    case 96: return by_rows<T, 96>(a, s);
    case 112: return by_rows<T, 112>(a, s);
    case 128: return by_rows<T, 128>(a, s);
    case 160: return by_rows<T, 160>(a, s);
    case 192: return by_rows<T, 192>(a, s);
    case 256: return by_rows<T, 256>(a, s);
  }
  return "attention: unsupported head size (supported: 64, 80, 96, 112, 128, 160, 192, 256)";
}

const char* launch_attention(const AttentionArgs& a, DType dtype, void* stream) {
  if (a.num_rows == 0 || a.max_query_len == 0) return nullptr;
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads) return "attention: num_heads must be a multiple of num_kv_heads";
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kFloat32: return by_head<float>(a, s);
    case kBFloat16: return by_head<__nv_bfloat16>(a, s);
    case kFloat16: return by_head<__half>(a, s);
  }
  return "attention: unsupported dtype (supported: float32, bfloat16, float16)";
}

const char* launch_reduce(const AttentionArgs& a, int num_tokens, DType out_dtype, void* stream) {
  if (num_tokens == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(num_tokens, a.num_heads);
  switch (out_dtype) {
    case kFloat32: PAGED_LAUNCH(grid, kThreads, s, reduce_kernel<float>)(a); return nullptr;
    case kBFloat16: PAGED_LAUNCH(grid, kThreads, s, reduce_kernel<__nv_bfloat16>)(a); return nullptr;
    case kFloat16: PAGED_LAUNCH(grid, kThreads, s, reduce_kernel<__half>)(a); return nullptr;
  }
  return "reduce: unsupported output dtype";
}

}  // namespace paged_cuda
