// paged_cpu layer ops (rms_norm, add_rms_norm, silu_and_mul, rotary, rotate_heads, pack_linear, linear): checks,
// new outputs, and the split over torch's threads; the arithmetic is in the per-ISA fused kernels.
#include <ATen/Parallel.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "fused_api.h"
#include "moe_api.h"
#include "ops.h"

namespace paged_cpu {
namespace {

// Elements one thread should have before a call forks: below this (one decode token's row, a few
// rows) the fork and join of torch's thread pool costs more than the work.
constexpr int64_t kParallelElems = 32768;

int64_t row_grain(int64_t elems_per_row) {
  return std::max<int64_t>(1, kParallelElems / std::max<int64_t>(1, elems_per_row));
}

Elem elem_of(const at::Tensor& t, const char* op, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return Elem::F32;
    case at::kBFloat16: return Elem::BF16;
    case at::kHalf: return Elem::F16;
    default:
      TORCH_CHECK(false, "paged_cpu.", op, ": ", what, " dtype ", t.scalar_type(),
                  " not supported (supported: float32, bfloat16, float16)");
  }
}

// The kernel variant follows the attention ISA switch: the portable build for `scalar`, else AVX2
// (every CPU that runs the AVX-512 attention variants has AVX2, FMA and F16C).
const FusedKernels& fused() {
  static const FusedKernels* const avx2 = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    return ok ? avx2_fused_kernels() : nullptr;
#else
    return static_cast<const FusedKernels*>(nullptr);
#endif
  }();
  if (avx2 != nullptr && std::strcmp(current_kernels().name, "scalar") != 0) return *avx2;
  return *scalar_fused_kernels();
}

// The kernels read rows with unit stride along the last dimension and any stride between rows.
at::Tensor unit_last(const at::Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous(); }

void check_rows(const at::Tensor& x, const char* op, const char* what) {
  TORCH_CHECK(x.dim() == 2, "paged_cpu.", op, ": ", what, " must be 2-D [tokens, hidden], got shape ", x.sizes());
}

void check_weight(const at::Tensor& weight, int64_t hidden, const char* op) {
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == hidden, "paged_cpu.", op, ": weight must be [", hidden,
              "] (the hidden size of x), got shape ", weight.sizes());
  elem_of(weight, op, "weight");
}

at::Tensor norm(const at::Tensor& x_in, const at::Tensor* residual_in, const at::Tensor& weight, double eps,
                const char* op, at::Tensor* sum_out) {
  check_rows(x_in, op, "x");
  const int64_t tokens = x_in.size(0), hidden = x_in.size(1);
  check_weight(weight, hidden, op);
  RmsArgs a{};
  const at::Tensor x = unit_last(x_in), w = weight.contiguous();
  at::Tensor r;
  a.type = elem_of(x, op, "x");
  if (residual_in != nullptr) {
    TORCH_CHECK(residual_in->sizes() == x_in.sizes(), "paged_cpu.", op, ": residual shape ", residual_in->sizes(),
                " does not match x shape ", x_in.sizes());
    TORCH_CHECK(residual_in->scalar_type() == x_in.scalar_type(), "paged_cpu.", op, ": residual dtype ",
                residual_in->scalar_type(), " does not match x dtype ", x_in.scalar_type());
    r = unit_last(*residual_in);
    *sum_out = at::empty({tokens, hidden}, x.options());
    a.residual = r.data_ptr();
    a.r_stride = r.stride(0);
    a.sum = sum_out->data_ptr();
  }
  at::Tensor out = at::empty({tokens, hidden}, x.options());
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.weight = w.data_ptr();
  a.w_type = elem_of(w, op, "weight");
  a.hidden = hidden;
  a.eps = static_cast<float>(eps);
  a.out = out.data_ptr();
  const RmsFn fn = fused().rms_norm;
  at::parallel_for(0, tokens, row_grain(hidden), [&](int64_t begin, int64_t end) { fn(a, begin, end); });
  return out;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return norm(x, nullptr, weight, eps, "rms_norm", nullptr);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  at::Tensor sum;
  at::Tensor out = norm(x, &residual, weight, eps, "add_rms_norm", &sum);
  return {out, sum};
}

at::Tensor silu_and_mul(const at::Tensor& x_in) {
  check_rows(x_in, "silu_and_mul", "x");
  TORCH_CHECK(x_in.size(1) % 2 == 0, "paged_cpu.silu_and_mul: the last dimension of x (gate then up) must be even, "
              "got shape ", x_in.sizes());
  const at::Tensor x = unit_last(x_in);
  const int64_t tokens = x.size(0), inter = x.size(1) / 2;
  at::Tensor out = at::empty({tokens, inter}, x.options());
  SiluArgs a{x.data_ptr(), x.stride(0), elem_of(x, "silu_and_mul", "x"), inter, out.data_ptr()};
  const SiluFn fn = fused().silu_and_mul;
  at::parallel_for(0, tokens, row_grain(inter), [&](int64_t begin, int64_t end) { fn(a, begin, end); });
  return out;
}

std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions_in, const at::Tensor& query_in,
                                          const at::Tensor& key_in, const at::Tensor& cache_in) {
  const at::ScalarType pos_type = positions_in.scalar_type();
  TORCH_CHECK(positions_in.dim() == 1 && (pos_type == at::kLong || pos_type == at::kInt),
              "paged_cpu.rotary: positions must be a 1-D int64 or int32 tensor, got ", positions_in.scalar_type(),
              " of shape ", positions_in.sizes());
  TORCH_CHECK(query_in.dim() == 3 && key_in.dim() == 3, "paged_cpu.rotary: query and key must be 3-D [tokens, heads, "
              "head_size], got shapes ", query_in.sizes(), " and ", key_in.sizes());
  const int64_t tokens = positions_in.size(0), d = query_in.size(2);
  TORCH_CHECK(query_in.size(0) == tokens && key_in.size(0) == tokens, "paged_cpu.rotary: query ", query_in.sizes(),
              " and key ", key_in.sizes(), " must have one token per position (", tokens, ")");
  TORCH_CHECK(key_in.size(2) == d && d % 2 == 0, "paged_cpu.rotary: query and key need the same even head_size, got ",
              d, " and ", key_in.size(2));
  TORCH_CHECK(cache_in.dim() == 2 && cache_in.size(1) == d, "paged_cpu.rotary: cos_sin_cache must be [max_position, ",
              d, "] (cos halves then sin halves of the head size), got shape ", cache_in.sizes());
  const at::Tensor positions = positions_in.to(at::kLong).contiguous();
  const at::Tensor cache = unit_last(cache_in), q = unit_last(query_in), k = unit_last(key_in);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t max_pos = cache.size(0);
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "paged_cpu.rotary: positions[", t, "] = ", pos[t],
                " is out of range for a cos_sin_cache of ", max_pos, " positions");
  at::Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(k.sizes(), k.options());
  RotaryArgs a{};
  a.positions = pos;
  a.cache = cache.data_ptr();
  a.cache_stride = cache.stride(0);
  a.cache_type = elem_of(cache, "rotary", "cos_sin_cache");
  a.head_size = d;
  a.q = {q.data_ptr(), q.stride(0), q.stride(1), elem_of(q, "rotary", "query"), q.size(1), q_out.data_ptr()};
  a.k = {k.data_ptr(), k.stride(0), k.stride(1), elem_of(k, "rotary", "key"), k.size(1), k_out.data_ptr()};
  const RotaryFn fn = fused().rotary;
  at::parallel_for(0, tokens, row_grain((q.size(1) + k.size(1)) * d), [&](int64_t begin, int64_t end) {
    fn(a, begin, end);
  });
  return {q_out, k_out};
}

at::Tensor rotate_heads(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 3, "paged_cpu.rotate_heads: x must be 3-D [tokens, heads, head_size], got shape ",
              x_in.sizes());
  const int64_t tokens = x_in.size(0), heads = x_in.size(1), d = x_in.size(2);
  TORCH_CHECK(d >= 1, "paged_cpu.rotate_heads: head_size must be positive, got shape ", x_in.sizes());
  const Elem type = elem_of(x_in, "rotate_heads", "x");
  const at::Tensor x = unit_last(x_in);
  at::Tensor out = at::empty({tokens, heads, d}, x.options());
  if (tokens == 0 || heads == 0) return out;
  const int64_t block = d & -d;  // the largest power of two dividing d
  HadamardArgs a{};
  a.src = x.data_ptr();
  a.token_stride = x.stride(0);
  a.head_stride = x.stride(1);
  a.type = type;
  a.heads = heads;
  a.head_size = d;
  a.block = block;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));  // as torch rounds a Python float
  a.dst = out.data_ptr();
  const HadamardFn fn = fused().rotate_heads;
  at::parallel_for(0, tokens, row_grain(heads * d), [&](int64_t begin, int64_t end) { fn(a, begin, end); });
  return out;
}

at::Tensor pack_linear(const at::Tensor& weight_in) {
  TORCH_CHECK(weight_in.dim() == 2, "paged_cpu.pack_linear: weight must be 2-D [out_features, in_features], got shape ",
              weight_in.sizes());
  const Elem type = elem_of(weight_in, "pack_linear", "weight");
  const at::Tensor w = weight_in.contiguous();
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kPanel - 1) / kPanel;
  at::Tensor packed = at::zeros({panels, k, kPanel}, w.options());
  const int64_t esize = w.element_size();
  const auto* src = static_cast<const char*>(w.data_ptr());
  auto* dst = static_cast<char*>(packed.data_ptr());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int j = 0; j < kPanel && p * kPanel + j < n; ++j) {
        // bf16 panels interleave features j and 8 + j in one 32-bit word (fused_api.h).
        const int64_t slot = type == Elem::BF16 ? (j < 8 ? 2 * j : 2 * (j - 8) + 1) : j;
        const char* row = src + (p * kPanel + j) * k * esize;
        char* col = dst + (p * k * kPanel + slot) * esize;
        for (int64_t i = 0; i < k; ++i) std::memcpy(col + i * kPanel * esize, row + i * esize, esize);
      }
  });
  return packed;
}

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                  int64_t out_features) {
  check_rows(x_in, "linear", "x");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.is_contiguous(),
              "paged_cpu.linear: packed must be a contiguous [panels, in_features, ", kPanel,
              "] tensor from pack_linear, got shape ", packed.sizes());
  const int64_t rows = x_in.size(0), k = x_in.size(1), panels = packed.size(0);
  TORCH_CHECK(packed.size(1) == k, "paged_cpu.linear: x has ", k, " features but the packed weight takes ",
              packed.size(1), " (x shape ", x_in.sizes(), ")");
  TORCH_CHECK(out_features > (panels - 1) * kPanel && out_features <= panels * kPanel,
              "paged_cpu.linear: out_features ", out_features, " does not fit a packed weight of ", panels, " panels");
  const Elem out_type = elem_of(x_in, "linear", "x");
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out_features, "paged_cpu.linear: bias must be [", out_features,
                "], got shape ", bias->sizes());
    elem_of(*bias, "linear", "bias");
    b = bias->to(at::kFloat).contiguous();
  }
  at::Tensor x = x_in;
  if (x.scalar_type() != at::kFloat || (k > 1 && x.stride(1) != 1))
    x = at::empty({rows, k}, x_in.options().dtype(at::kFloat)).copy_(x_in);
  at::Tensor out = at::empty({rows, out_features}, x_in.options());
  LinearArgs a{};
  a.x = x.data_ptr<float>();
  a.ldx = x.stride(0);
  a.rows = rows;
  a.in_features = k;
  a.w = packed.data_ptr();
  a.w_type = elem_of(packed, "linear", "packed");
  a.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  a.out_features = out_features;
  a.out = out.data_ptr();
  a.out_type = out_type;
  const LinearFn fn = fused().linear;
  // Work per panel: its weights, read once, and rows * k * 16 multiply-adds (16 per AVX2 pair of FMAs).
  const int64_t per_panel = k * kPanel * std::max<int64_t>(1, (rows + 3) / 4);
  if (rows > 0)
    at::parallel_for(0, panels, std::max<int64_t>(1, 4 * kParallelElems / per_panel),
                     [&](int64_t begin, int64_t end) { fn(a, begin, end); });
  return out;
}

namespace {

// set_quant_isa's choice; nullptr = auto.
std::atomic<const QuantKernels*> g_quant_forced{nullptr};

// The packed-weight kernels: by default they follow the layer kernels (avx2, or the portable build for
// `scalar`). The 16-lane AVX-512 build is chosen only by set_quant_isa("avx512"): on the AVX-512 Zen 4
// machine it was measured on (512-bit operations run as two 256-bit halves there) it gave no decode
// gain and a slower dequantize path (README, "Packed weights").
const QuantKernels& quant() {
  if (const QuantKernels* forced = g_quant_forced.load(std::memory_order_relaxed)) return *forced;
  const QuantKernels* avx2 = avx2_quant_kernels();
  if (avx2 != nullptr && std::strcmp(fused().name, "avx2") == 0) {
    // Where the CPU has AVX-512VL, the same arithmetic with 32 registers (wider dequantize tiles, same bits).
    if (const QuantKernels* vl = avx2_vl_quant_kernels()) return *vl;
    return *avx2;
  }
  return *scalar_quant_kernels();
}

// How q4_0 / q4_1 multiply (quant_q8_body.h): 0 exact fp32 activations, 1 one int8 level per 32-wide block,
// 2 two levels (the default: x rounded, then what that left rounded again). PAGED_CPU_LINEAR_ACTIVATIONS=
// fp32|int8|int8x2 or set_linear_activations() choose; every mode is batch-invariant.
int activation_mode(const std::string& mode) {
  TORCH_CHECK(mode == "int8x2" || mode == "int8" || mode == "fp32", "paged_cpu: linear activations must be int8x2, "
              "int8 or fp32, got '", mode, "'");
  return mode == "fp32" ? 0 : mode == "int8" ? 1 : 2;
}

std::atomic<int>& g_q8_activations() {
  static std::atomic<int> mode{[] {
    const char* env = std::getenv("PAGED_CPU_LINEAR_ACTIVATIONS");
    return env == nullptr || *env == '\0' ? 2 : activation_mode(env);
  }()};
  return mode;
}

bool q8_format(QFormat f) { return f == QFormat::Q4_0 || f == QFormat::Q4_1; }

// The q8 path's kernels: those of a forced avx2 or scalar build; otherwise (auto, avx512) the VNNI build where
// the CPU has it, else those of quant() (the avx512 build has none of its own, and implies AVX2).
const Q8Kernels& q8_kernels() {
  const QuantKernels* forced = g_quant_forced.load(std::memory_order_relaxed);
  if (forced != nullptr && forced->q8 != nullptr) return *forced->q8;
  if (std::strcmp(quant().name, "scalar") != 0)
    if (const Q8Kernels* vnni = vnni_q8_kernels()) return *vnni;
  return quant().q8 != nullptr ? *quant().q8 : *avx2_quant_kernels()->q8;
}

// Packed bytes one thread should have before a streaming call forks (a k/v projection of the
// embedded model in q4_0, 62 KB, still splits in two).
constexpr int64_t kQuantParallelBytes = 24 * 1024;
// Output features the dequantize path turns into fp32 at a time: about 128 KB of scratch (L2).
constexpr int64_t kQuantScratchFloats = 32 * 1024;

}  // namespace

at::Tensor quant_linear(const at::Tensor& x_in, const at::Tensor& data, const std::optional<at::Tensor>& scale,
                        const std::optional<at::Tensor>& bias, int64_t fmt, int64_t out_features, int64_t stream_rows,
                        const std::optional<at::Tensor>& interleaved) {
  check_rows(x_in, "quant_linear", "x");
  TORCH_CHECK(fmt >= 0 && fmt < kQuantFormats, "paged_cpu.quant_linear: fmt ", fmt,
              " is not a format id (0 q4_0, 1 q4_1, 2 q8_0, 3 q4_k, 4 q6_k, 5 int8)");
  const QuantFormatInfo& info = kQuantFormatInfo[fmt];
  const QFormat format = static_cast<QFormat>(fmt);
  const int64_t rows = x_in.size(0), k = x_in.size(1), n = out_features;
  const Elem out_type = elem_of(x_in, "quant_linear", "x");
  TORCH_CHECK(k >= 1 && k % info.block == 0, "paged_cpu.quant_linear: x has ", k, " features, not a positive multiple "
              "of the ", info.name, " block of ", info.block, " (x shape ", x_in.sizes(), ")");
  TORCH_CHECK(n >= 1, "paged_cpu.quant_linear: out_features must be positive, got ", n);
  const at::ScalarType data_type = format == QFormat::INT8 ? at::kChar : at::kByte;
  const int64_t row_bytes = k / info.block * info.bytes;
  TORCH_CHECK(data.device().is_cpu() && data.scalar_type() == data_type, "paged_cpu.quant_linear: data must be a ",
              "cpu ", data_type, " tensor for ", info.name, ", got ", data.scalar_type(), " on ", data.device());
  TORCH_CHECK(data.dim() == 2 && data.size(0) == n && data.size(1) == row_bytes, "paged_cpu.quant_linear: data must ",
              "be [", n, ", ", row_bytes, "] (out_features, ", k / info.block, " blocks of ", info.bytes, " bytes of ",
              info.name, " per row for K = ", k, "), got shape ", data.sizes());
  TORCH_CHECK(data.stride(1) == 1 || row_bytes == 1, "paged_cpu.quant_linear: data rows must be contiguous, got ",
              "strides ", data.strides());
  at::Tensor s;
  if (format == QFormat::INT8) {
    TORCH_CHECK(scale.has_value() && scale->defined(), "paged_cpu.quant_linear: int8 needs scale, an fp32 [", n,
                "] tensor of per-row scales");
    TORCH_CHECK(scale->device().is_cpu() && scale->scalar_type() == at::kFloat && scale->dim() == 1 &&
                scale->size(0) == n, "paged_cpu.quant_linear: scale must be a cpu float32 [", n, "] tensor, got ",
                scale->scalar_type(), " of shape ", scale->sizes(), " on ", scale->device());
    s = scale->contiguous();
  } else {
    TORCH_CHECK(!(scale.has_value() && scale->defined()), "paged_cpu.quant_linear: scale must be None for ", info.name,
                " (its scales are inside the blocks)");
  }
  const bool has_x8 = interleaved.has_value() && interleaved->defined();
  if (has_x8) {
    const int64_t group_bytes = k / 32 * x8_block_bytes(format == QFormat::Q4_1);
    TORCH_CHECK(format == QFormat::Q4_0 || format == QFormat::Q4_1, "paged_cpu.quant_linear: an interleaved copy is "
                "only read for q4_0 and q4_1, not ", info.name);
    TORCH_CHECK(n % 8 == 0 && interleaved->device().is_cpu() && interleaved->scalar_type() == at::kByte &&
                interleaved->dim() == 2 && interleaved->size(0) == n / 8 && interleaved->size(1) == group_bytes &&
                interleaved->is_contiguous(), "paged_cpu.quant_linear: interleaved must be a contiguous cpu uint8 [",
                n / 8, ", ", group_bytes, "] tensor (", info.name, " rows in groups of 8; out_features a multiple of "
                "8), got ", interleaved->scalar_type(), " of shape ", interleaved->sizes());
  }
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "paged_cpu.quant_linear: bias must be [", n, "], got shape ",
                bias->sizes());
    elem_of(*bias, "quant_linear", "bias");
    b = bias->to(at::kFloat).contiguous();
  }
  at::Tensor x = x_in;
  if (x.scalar_type() != at::kFloat || (k > 1 && x.stride(1) != 1))
    x = at::empty({rows, k}, x_in.options().dtype(at::kFloat)).copy_(x_in);
  at::Tensor out = at::empty({rows, n}, x_in.options());
  if (rows == 0) return out;
  QuantArgs a{};
  a.x = x.data_ptr<float>();
  a.ldx = x.stride(0);
  a.rows = rows;
  a.in_features = k;
  a.w = static_cast<const uint8_t*>(data.data_ptr());
  a.ldw = data.stride(0);
  a.format = format;
  a.scale = s.defined() ? s.data_ptr<float>() : nullptr;
  a.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  a.out_features = n;
  a.out = out.data_ptr();
  a.out_type = out_type;
  const QuantKernels& kernels = quant();
  // 0: exact fp32 activations; 1 or 2: int8 levels (g_q8_activations), read once per call.
  const int levels = q8_format(format) ? g_q8_activations().load(std::memory_order_relaxed) : 0;
  if (levels != 0) {
    // One rule at every row count (batch invariance, quant_q8_body.h / quant_x8_body.h): x rounded once here,
    // before the threads split the features. Grow-only buffers per calling thread: no allocation per call in a
    // decode loop.
    const int64_t blocks = k / 32;
    const Q8Kernels& q8 = q8_kernels();
    thread_local std::vector<int8_t> xq[2];
    thread_local std::vector<float> scales[2];
    thread_local std::vector<float> residual;
    for (int l = 0; l < levels; ++l) {
      if (xq[l].size() < static_cast<size_t>(rows * k)) xq[l].resize(static_cast<size_t>(rows * k));
      if (scales[l].size() < static_cast<size_t>(2 * rows * blocks)) scales[l].resize(static_cast<size_t>(2 * rows * blocks));
    }
    q8.round(a.x, a.ldx, rows, k, xq[0].data(), scales[0].data());
    if (levels == 2) {
      // Second level: what the first left, x - d * q per element, rounded by the same rule; the product is the
      // sum of the two levels' products (each with its own m term), so activations keep ~15 bits per block.
      if (residual.size() < static_cast<size_t>(rows * k)) residual.resize(static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < k; ++j)
          residual[r * k + j] = a.x[r * a.ldx + j] - scales[0][2 * (r * blocks + j / 32)] * static_cast<float>(xq[0][r * k + j]);
      q8.round(residual.data(), k, rows, k, xq[1].data(), scales[1].data());
    }
    // One level's product into `dst` (rows x n, of `type`), with `bias` or none.
    auto product = [&](int level, void* dst, Elem type, const float* bias_ptr) {
      QuantArgs args = a;
      args.xq = xq[level].data();
      args.xds = scales[level].data();
      args.out = dst;
      args.out_type = type;
      args.bias = bias_ptr;
      const size_t elem = type == Elem::F32 ? 4 : 2;
      if (has_x8 && q8.stream_x8 != nullptr) {
        // Lanes are features: threads take units of 16 (two groups of 8), each at least kQuantParallelBytes.
        args.w = static_cast<const uint8_t*>(interleaved->data_ptr());
        const QuantFn x8 = q8.stream_x8;
        // 16 rows at a time on AMX tiles where the CPU has them (the same bits, quant_amx.cpp), the rest on VNNI.
        const QuantFn amx = std::strcmp(q8.name, "vnni") == 0 ? amx_x8_stream() : nullptr;
        const int64_t tiled = amx != nullptr ? rows / 16 * 16 : 0;
        QuantArgs rest = args;
        rest.rows = rows - tiled;
        rest.xq = args.xq + tiled * k;
        rest.xds = args.xds + 2 * tiled * blocks;
        rest.out = static_cast<char*>(args.out) + tiled * n * elem;
        QuantArgs head = args;
        head.rows = tiled;
        const int64_t unit_bytes = 16 * row_bytes * ((rows + 3) / 4);
        at::parallel_for(0, (n + 15) / 16, std::max<int64_t>(1, kQuantParallelBytes / unit_bytes),
                         [&](int64_t begin, int64_t end) {
                           if (tiled > 0) amx(head, begin * 16, std::min(n, end * 16));
                           if (rest.rows > 0) x8(rest, begin * 16, std::min(n, end * 16));
                         });
        return;
      }
      const QuantFn fn = q8.stream;
      const int64_t units = (n + kQuantGroup - 1) / kQuantGroup;
      const int64_t unit_bytes = kQuantGroup * row_bytes * ((rows + 3) / 4);
      at::parallel_for(0, units, std::max<int64_t>(1, kQuantParallelBytes / unit_bytes), [&](int64_t begin, int64_t end) {
        fn(args, begin * kQuantGroup, std::min(n, end * kQuantGroup));
      });
    };
    if (levels == 1) {
      product(0, a.out, a.out_type, a.bias);
      return out;
    }
    at::Tensor first = at::empty({rows, n}, x_in.options().dtype(at::kFloat));
    at::Tensor second = at::empty({rows, n}, x_in.options().dtype(at::kFloat));
    product(0, first.data_ptr(), Elem::F32, nullptr);
    product(1, second.data_ptr(), Elem::F32, nullptr);
    first.add_(second);  // elementwise: each output's bits depend on its own two sums only
    if (b.defined()) first.add_(b);
    out.copy_(first);  // one rounding to x's dtype
    return out;
  }
  if (rows <= stream_rows) {
    // Units of kQuantGroup features; a thread streams at least kQuantParallelBytes of packed rows.
    const QuantFn fn = kernels.stream;
    const int64_t units = (n + kQuantGroup - 1) / kQuantGroup;
    const int64_t unit_bytes = kQuantGroup * row_bytes * ((rows + 3) / 4);
    at::parallel_for(0, units, std::max<int64_t>(1, kQuantParallelBytes / unit_bytes), [&](int64_t begin, int64_t end) {
      fn(a, begin * kQuantGroup, std::min(n, end * kQuantGroup));
    });
  } else {
    // Chunks of output features, each dequantized once into a thread's scratch; at least one per thread.
    int64_t chunk = std::max<int64_t>(kQuantGroup, kQuantScratchFloats / k / kQuantGroup * kQuantGroup);
    const int64_t threads = at::get_num_threads();
    const int64_t even = (n + threads - 1) / threads;
    chunk = std::min(chunk, (even + kQuantGroup - 1) / kQuantGroup * kQuantGroup);
    a.chunk = chunk;
    const QuantFn fn = kernels.dequant_dot;
    at::parallel_for(0, (n + chunk - 1) / chunk, 1, [&](int64_t begin, int64_t end) {
      fn(a, begin * chunk, std::min(n, end * chunk));
    });
  }
  return out;
}

std::string fused_isa() { return fused().name; }

std::string quant_isa() { return quant().name; }

std::string quant_q8_isa() { return q8_kernels().name; }

// moe_api.h: the same kernels and modes for the routed experts (moe_ops.cpp).
const QuantKernels& quant_kernels_in_use() { return quant(); }
const Q8Kernels& q8_kernels_in_use() { return q8_kernels(); }
int q8_activation_levels() { return g_q8_activations().load(std::memory_order_relaxed); }
const FusedKernels& fused_kernels_in_use() { return fused(); }

bool quant_amx() { return std::strcmp(q8_kernels().name, "vnni") == 0 && amx_x8_stream() != nullptr; }

std::string linear_activations() {
  const int mode = g_q8_activations().load();
  return mode == 0 ? "fp32" : mode == 1 ? "int8" : "int8x2";
}

std::string set_linear_activations(const std::string& mode) {
  g_q8_activations().store(activation_mode(mode));
  return linear_activations();
}

std::string set_quant_isa(const std::string& name) {
  if (name == "auto") {
    g_quant_forced.store(nullptr);
    return quant_isa();
  }
  std::vector<std::string> usable;
  const std::vector<std::string> isas = supported_isas();
  auto has = [&](const char* isa) { return std::find(isas.begin(), isas.end(), isa) != isas.end(); };
  const QuantKernels* builds[] = {has("avx512") ? avx512_quant_kernels() : nullptr,
                                  has("avx2") ? avx2_quant_kernels() : nullptr, scalar_quant_kernels()};
  for (const QuantKernels* k : builds) {
    if (k == nullptr) continue;
    if (name == k->name) {
      g_quant_forced.store(k);
      return quant_isa();
    }
    usable.emplace_back(k->name);
  }
  TORCH_CHECK(false, "paged_cpu: packed-weight kernels '", name, "' are not available here (available: auto, ",
              c10::Join(", ", usable), ")");
}

}  // namespace paged_cpu
