// paged_cpu::moe_route: paged_core's route_experts in one op, (weights [T, k] fp32, ids [T, k] int32) from router
// logits [T, E] (fp32, bf16 or fp16, any strides), so that a decode step routes without a dozen small torch ops.
//
// The choice is route_experts': the k largest logits (in fp32) largest first, an exact tie to the lower expert id, NaN
// above everything (torch.sort's descending order). Softmax weights are its bits on x86-64 (GCC builds): the softmax
// is torch's lastdim softmax re-traced (the row's max and sum folded lane by lane as vec::reduce_all folds them for
// the capability torch dispatches to, SLEEF's expf per lane, times 1 / sum), and the renormalising sum is torch's
// cascade sum of a [T, k] row (ilp-4 row_sum below 8 slots, 8-lane vectors from 8 on); elsewhere the same arithmetic
// with std::exp and the generic lanes, within a few ulps.
// The sigmoid is the vector loop of torch's elementwise kernel (1 / (1 + expf(0 - x)), SLEEF's expf) for every
// logit. torch computes the last (T * E) % 32 logits of a batch (with AVX-512; each row's last E % 32 when the rows
// are apart) in its scalar loop with std::exp, where its weights may differ in the last bit: which logits those are
// depends on the batch, and a token's routing here must not.
//
// Each token's routing depends on its own logits only (batch-invariant).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "moe_route_api.h"

namespace paged_cpu {
namespace {

constexpr int64_t kSoftmax = 0, kSigmoid = 1;

// How torch's float kernels vectorize on this CPU: the capability its dispatch chose (ATEN_CPU_CAPABILITY included).
struct TorchVec {
  int lanes;         // Vectorized<float>::size()
  bool tree;         // vec_reduce_all folds lanes pairwise (AVX2, AVX-512) or one after another (generic Vectorized)
  ExpShiftedFn exp;  // nullptr: std::exp per lane (generic Vectorized)
};

const TorchVec& torch_vec() {
  static const TorchVec tv = [] {
    const std::string cap = at::get_cpu_capability();
    if (cap == "AVX512" && route_exp_avx512() != nullptr) return TorchVec{16, true, route_exp_avx512()};
    if (cap == "AVX2" && route_exp_avx2() != nullptr) return TorchVec{8, true, route_exp_avx2()};
    return TorchVec{8, false, nullptr};
  }();
  return tv;
}

float add(float a, float b) { return a + b; }
// vec::maximum: NaN if either is; else _mm*_max_ps's (a > b ? a : b).
float maximum(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return a > b ? a : b;
}

// torch's vec::reduce_all(op, d, n) (functional_base.h) in scalar code: lanes accumulate whole vectors, a partial
// last vector only into its lanes, then the lanes are folded; fewer than one vector is folded element by element.
float reduce_all(const TorchVec& tv, const float* d, int64_t n, float (*op)(float, float)) {
  const int w = tv.lanes;
  if (n < w) {
    float a = d[0];
    for (int64_t i = 1; i < n; ++i) a = op(a, d[i]);
    return a;
  }
  std::array<float, 16> acc{};
  for (int l = 0; l < w; ++l) acc[l] = d[l];
  int64_t i = w;
  for (; i + w <= n; i += w)
    for (int l = 0; l < w; ++l) acc[l] = op(acc[l], d[i + l]);
  for (int l = 0; i + l < n; ++l) acc[l] = op(acc[l], d[i + l]);
  if (!tv.tree) {
    float a = acc[0];
    for (int l = 1; l < w; ++l) a = op(a, acc[l]);
    return a;
  }
  for (int s = w / 2; s >= 1; s /= 2) {  // halves swapped, then quarters, ... (the shuffles of VecReduceAllSIMD)
    std::array<float, 16> next{};
    for (int l = 0; l < w; ++l) next[l] = op(acc[l], acc[l ^ s]);
    acc = next;
  }
  return acc[0];
}

void exp_shifted(const TorchVec& tv, const float* x, float shift, float* out, int64_t n) {
  if (tv.exp != nullptr) return tv.exp(x, shift, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i] - shift);
}

// torch's cascade sum (SumKernel.cpp) of one contiguous row, for 8-lane vectors (Lanes) or scalars (float).
struct Lanes {
  std::array<float, 8> v{};
  Lanes& operator+=(const Lanes& o) {
    for (int l = 0; l < 8; ++l) v[l] += o.v[l];
    return *this;
  }
};

int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(x) - 1; v != 0; v >>= 1) ++bits;
  return bits;
}

// multi_row_sum: 4 partial sums of `size` rows (load(i, j): row i's column j), in its levels of 16+ rows.
template <typename V, typename Load>
std::array<V, 4> multi_row_sum(const Load& load, int64_t size) {
  constexpr int kLevels = 4, kRows = 4;
  const int64_t power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  std::array<std::array<V, kRows>, kLevels> acc{};
  int64_t i = 0;
  for (; i + step <= size;) {
    for (int64_t j = 0; j < step; ++j, ++i)
      for (int k = 0; k < kRows; ++k) acc[0][k] += load(i, k);
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kRows; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = V{};
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < kRows; ++k) acc[0][k] += load(i, k);
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kRows; ++k) acc[0][k] += acc[j][k];
  return acc[0];
}

// row_sum: elements i, i + 4, ... into 4 partials, the rest into the first, then the partials in order.
template <typename V, typename Load>
V row_sum(const Load& at, int64_t size) {
  const int64_t size_ilp = size / 4;
  std::array<V, 4> p = multi_row_sum<V>([&](int64_t i, int k) { return at(4 * i + k); }, size_ilp);
  for (int64_t i = size_ilp * 4; i < size; ++i) p[0] += at(i);
  for (int k = 1; k < 4; ++k) p[0] += p[k];
  return p[0];
}

// w[0 .. k).sum() as torch sums the last dim of a contiguous fp32 [T, k] (its sum kernel has 8-lane vectors on x86).
float torch_sum(const float* w, int64_t k) {
  if (k < 8) return row_sum<float>([&](int64_t i) { return w[i]; }, k);
  const int64_t vecs = k / 8;
  const Lanes lanes = row_sum<Lanes>(
      [&](int64_t i) {
        Lanes l;
        std::copy(w + 8 * i, w + 8 * i + 8, l.v.begin());
        return l;
      },
      vecs);
  float acc = 0.0f;
  for (int64_t j = vecs * 8; j < k; ++j) acc += w[j];
  for (int l = 0; l < 8; ++l) acc += lanes.v[l];
  return acc;
}

// Before in torch.sort(descending=True)'s order: larger, NaN above everything (equal values keep expert order).
bool before(float a, float b) {
  if (std::isnan(a)) return !std::isnan(b);
  if (std::isnan(b)) return false;
  return a > b;
}

template <typename T>
void load_row(const T* p, int64_t stride, int64_t n, float* out) {
  for (int64_t e = 0; e < n; ++e) out[e] = static_cast<float>(p[e * stride]);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, int64_t top_k, int64_t scoring,
                                             bool renormalize, double routed_scaling) {
  TORCH_CHECK(logits.dim() == 2 && logits.device().is_cpu(),
              "paged_cpu.moe_route: logits must be a 2-D cpu tensor [tokens, experts], got shape ", logits.sizes(),
              " on ", logits.device());
  const auto dtype = logits.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, "paged_cpu.moe_route: logits dtype ",
              dtype, " not supported (supported: float32, bfloat16, float16)");
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  TORCH_CHECK(top_k >= 1 && top_k <= experts, "paged_cpu.moe_route: top_k = ", top_k, " must be in 1 .. ", experts);
  TORCH_CHECK(scoring == kSoftmax || scoring == kSigmoid, "paged_cpu.moe_route: scoring must be 0 (softmax) or 1 "
              "(sigmoid), got ", scoring);
  at::Tensor weights = at::empty({tokens, top_k}, logits.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({tokens, top_k}, logits.options().dtype(at::kInt));
  if (tokens == 0) return {weights, ids};
  const TorchVec& tv = torch_vec();
  const float scaling = static_cast<float>(routed_scaling);  // torch multiplies an fp32 tensor by the float scalar
  const int64_t s0 = logits.stride(0), s1 = logits.stride(1);
  float* wout = weights.data_ptr<float>();
  int32_t* iout = ids.data_ptr<int32_t>();
  at::parallel_for(0, tokens, std::max<int64_t>(1, 4096 / experts), [&](int64_t begin, int64_t end) {
    std::vector<float> row(experts), e(experts), top(top_k), chosen(top_k);
    std::vector<int32_t> slot(top_k);
    for (int64_t t = begin; t < end; ++t) {
      switch (dtype) {
        case at::kFloat: load_row(logits.const_data_ptr<float>() + t * s0, s1, experts, row.data()); break;
        case at::kBFloat16:
          load_row(logits.const_data_ptr<at::BFloat16>() + t * s0, s1, experts, row.data());
          break;
        default: load_row(logits.const_data_ptr<at::Half>() + t * s0, s1, experts, row.data()); break;
      }
      // The top k by insertion, in expert order: a later expert passes an earlier one only if strictly before it.
      int64_t n = 0;
      for (int64_t x = 0; x < experts; ++x) {
        const float v = row[x];
        if (n == top_k && !before(v, top[n - 1])) continue;
        int64_t j = n < top_k ? n++ : n - 1;
        for (; j > 0 && before(v, top[j - 1]); --j) {
          top[j] = top[j - 1];
          slot[j] = slot[j - 1];
        }
        top[j] = v;
        slot[j] = static_cast<int32_t>(x);
      }
      if (scoring == kSoftmax) {  // _vec_softmax_lastdim: max, exp(x - max), sum, times 1 / sum
        const float m = reduce_all(tv, row.data(), experts, maximum);
        exp_shifted(tv, row.data(), m, e.data(), experts);
        const float inv = 1.0f / reduce_all(tv, e.data(), experts, add);
        for (int64_t j = 0; j < top_k; ++j) chosen[j] = e[slot[j]] * inv;
      } else {  // sigmoid's vector loop: 1 / (1 + exp(0 - x))
        for (int64_t j = 0; j < top_k; ++j) top[j] = 0.0f - top[j];
        exp_shifted(tv, top.data(), 0.0f, chosen.data(), top_k);
        for (int64_t j = 0; j < top_k; ++j) chosen[j] = 1.0f / (1.0f + chosen[j]);
      }
      if (renormalize) {
        const float sum = torch_sum(chosen.data(), top_k);
        for (int64_t j = 0; j < top_k; ++j) chosen[j] = chosen[j] / sum;
      }
      if (scaling != 1.0f)
        for (int64_t j = 0; j < top_k; ++j) chosen[j] = chosen[j] * scaling;
      std::copy(chosen.begin(), chosen.end(), wout + t * top_k);
      std::copy(slot.begin(), slot.end(), iout + t * top_k);
    }
  });
  return {weights, ids};
}

}  // namespace paged_cpu

TORCH_LIBRARY_FRAGMENT(paged_cpu, m) {
  m.def("moe_route(Tensor logits, int top_k, int scoring, bool renormalize, float routed_scaling) -> (Tensor, "
        "Tensor)");
}

TORCH_LIBRARY_IMPL(paged_cpu, CPU, m) { m.impl("moe_route", &paged_cpu::moe_route); }
