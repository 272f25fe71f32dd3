// paged_cpu::moe: routed experts of x [T, H] over packed (q4_0, q4_1, q8_0, q4_k, q6_k, int8) or dense (fp32, bf16,
// fp16) expert weights, read in place, for a routing computed before (weights [T, k] fp32, ids [T, k] int32).
//
// The T * k (token, slot) pairs are grouped by expert (a counting sort, stable: token then slot order), each expert's
// rows gathered into one block, and for every expert that has rows: gate_up (2I features), the gated activation,
// down (H features), by the packed linear's own kernels (quant_body.h, quant_q8_body.h, quant_x8_body.h: the ones
// quant_linear runs on those rows, q4_0 / q4_1 with int8 activations, see expert_q8) or moe_avx2.cpp's dense rows.
// Only the chosen experts' bytes are read, each once per tile of rows, never dequantized whole. Each product is one
// parallel_for over (expert, feature range) units balanced by their cost, so a decode step's k experts share the
// threads. Then each token's k outputs times their weights, summed in slot order in fp32 (mul, then add: the
// reference's arithmetic), rounded once to x's dtype.
//
// Batch invariance: every kernel here computes each row's outputs in an order fixed by the layer's sizes (the packed
// paths' rule, quant_body.h; dense rows are one more format of it), activations are rounded per row, and the sum over
// slots is per token. So a token's bits never depend on which other tokens share the call or its experts.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "moe_api.h"

namespace paged_cpu {
namespace {

constexpr int64_t kDenseFmt = -1;
// Packed bytes a part of a product should have before the work is split between threads (as quant_linear).
constexpr int64_t kPartBytes = 24 * 1024;
// Output features the dequantize path turns into fp32 at a time (about 128 KB of scratch, as quant_linear).
constexpr int64_t kScratchFloats = 32 * 1024;
// The fp32 scratch of one pass over the tokens (gathered inputs, products, activations): larger calls go in chunks
// of tokens (each token's arithmetic is its own, so chunks change no bit).
constexpr int64_t kPassFloats = int64_t{32} << 20;

Elem elem_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return Elem::F32;
    case at::kBFloat16: return Elem::BF16;
    case at::kHalf: return Elem::F16;
    default:
      TORCH_CHECK(false, "paged_cpu.moe: ", what, " dtype ", t.scalar_type(),
                  " not supported (supported: float32, bfloat16, float16)");
  }
}

// One projection's experts (gate_up or down): rows n per expert of k inputs.
struct Proj {
  bool dense = false;
  Elem w_type = Elem::F32;       // dense
  QFormat format = QFormat::Q4_0;  // packed
  const uint8_t* w = nullptr;
  int64_t ldw = 0;               // bytes from one row to the next
  int64_t expert_bytes = 0;      // bytes from one expert's first row to the next's
  const float* scale = nullptr;  // int8: [E * n]
  const uint8_t* x8 = nullptr;   // q4_0 / q4_1 in groups of 8 rows (quant_x8_body.h), or nullptr
  int64_t x8_expert_bytes = 0;
  int64_t n = 0, k = 0;
  int64_t row_bytes = 0;         // bytes of one row (the cost of reading it)
  int64_t stream_rows = 0;       // exact packed paths: rows up to this stream, more dequantize chunks first
  bool q8 = false;               // q4_0 / q4_1 with int8 activations (one level, see expert_q8)
};

bool q8_format(QFormat f) { return f == QFormat::Q4_0 || f == QFormat::Q4_1; }

// Whether q4_0 / q4_1 experts round their inputs to int8: as quant_linear unless its activations are fp32, with one
// level where quant_linear's default (int8x2) takes two. One level is the contract's declared rounding
// (q8_activation_formats: paged_core.quant.round_activations_q8), which the conformance suite's MoE oracle holds a
// kernel to; the second level's residue (about 1e-3 of an output after two products and the activation) fits
// neither that oracle nor its float32 tolerance. It also halves the integer products.
bool expert_q8() { return q8_activation_levels() != 0; }

// Checks one projection's tensors and describes them; `experts` and `n` are what the layer needs (-1: any).
Proj make_proj(const char* name, const at::Tensor& w, const std::optional<at::Tensor>& scale,
               const std::optional<at::Tensor>& x8, int64_t fmt, int64_t stream_rows, int64_t experts, int64_t n,
               int64_t k, std::vector<at::Tensor>& keep) {
  Proj p;
  p.n = n;
  p.k = k;
  p.stream_rows = stream_rows;
  TORCH_CHECK(w.device().is_cpu(), "paged_cpu.moe: ", name, " must be on the cpu, got ", w.device());
  if (fmt == kDenseFmt) {
    TORCH_CHECK(w.dim() == 3 && w.size(0) == experts && w.size(1) == n && w.size(2) == k, "paged_cpu.moe: dense ",
                name, " must be [", experts, ", ", n, ", ", k, "] (experts, rows, inputs), got shape ", w.sizes());
    TORCH_CHECK(w.stride(2) == 1 || k == 1, "paged_cpu.moe: dense ", name, " rows must be contiguous, got strides ",
                w.strides());
    p.dense = true;
    p.w_type = elem_of(w, name);
    const int64_t esize = static_cast<int64_t>(w.element_size());
    p.w = static_cast<const uint8_t*>(w.data_ptr());
    p.ldw = w.stride(1) * esize;
    p.expert_bytes = w.stride(0) * esize;
    p.row_bytes = k * esize;
    TORCH_CHECK(!(scale.has_value() && scale->defined()) && !(x8.has_value() && x8->defined()), "paged_cpu.moe: dense ",
                name, " takes no scale and no interleaved copy");
    return p;
  }
  TORCH_CHECK(fmt >= 0 && fmt < kQuantFormats, "paged_cpu.moe: ", name, " fmt ", fmt,
              " is not a format id (-1 dense, 0 q4_0, 1 q4_1, 2 q8_0, 3 q4_k, 4 q6_k, 5 int8)");
  const QuantFormatInfo& info = kQuantFormatInfo[fmt];
  p.format = static_cast<QFormat>(fmt);
  TORCH_CHECK(k % info.block == 0, "paged_cpu.moe: ", name, " has ", k, " inputs, not a multiple of the ", info.name,
              " block of ", info.block);
  p.row_bytes = k / info.block * info.bytes;
  const at::ScalarType data_type = p.format == QFormat::INT8 ? at::kChar : at::kByte;
  TORCH_CHECK(w.scalar_type() == data_type && w.dim() == 2 && w.size(0) == experts * n && w.size(1) == p.row_bytes,
              "paged_cpu.moe: packed ", name, " must be a ", data_type, " [", experts * n, ", ", p.row_bytes, "] tensor (",
              experts, " experts of ", n, " ", info.name, " rows of ", k, " inputs), got ", w.scalar_type(), " ",
              w.sizes());
  TORCH_CHECK(w.stride(1) == 1 || p.row_bytes == 1, "paged_cpu.moe: packed ", name, " rows must be contiguous, got "
              "strides ", w.strides());
  p.w = static_cast<const uint8_t*>(w.data_ptr());
  p.ldw = w.stride(0);
  p.expert_bytes = n * w.stride(0);
  if (p.format == QFormat::INT8) {
    TORCH_CHECK(scale.has_value() && scale->defined() && scale->device().is_cpu() &&
                scale->scalar_type() == at::kFloat && scale->dim() == 1 && scale->size(0) == experts * n,
                "paged_cpu.moe: int8 ", name, " needs scale, a cpu float32 [", experts * n, "] tensor of row scales");
    keep.push_back(scale->contiguous());
    p.scale = keep.back().data_ptr<float>();
  } else {
    TORCH_CHECK(!(scale.has_value() && scale->defined()), "paged_cpu.moe: ", name, " scale must be None for ",
                info.name, " (its scales are inside the blocks)");
  }
  p.q8 = q8_format(p.format) && expert_q8();
  if (x8.has_value() && x8->defined()) {
    const int64_t group_bytes = k / 32 * x8_block_bytes(p.format == QFormat::Q4_1);
    TORCH_CHECK(q8_format(p.format) && n % 8 == 0 && x8->device().is_cpu() && x8->scalar_type() == at::kByte &&
                x8->dim() == 2 && x8->size(0) == experts * n / 8 && x8->size(1) == group_bytes && x8->is_contiguous(),
                "paged_cpu.moe: ", name, " interleaved must be a contiguous uint8 [", experts * n / 8, ", ", group_bytes,
                "] tensor (q4_0 / q4_1 rows in groups of 8, each expert's rows a multiple of 8), got ",
                x8->scalar_type(), " ", x8->sizes());
    p.x8 = static_cast<const uint8_t*>(x8->data_ptr());
    p.x8_expert_bytes = n / 8 * group_bytes;
  }
  return p;
}

// The pairs of one pass grouped by expert: expert e's rows are start[e] .. start[e] + count[e] of the gathered
// blocks; `active` lists the experts with rows.
struct Groups {
  std::vector<int64_t> start, count;
  std::vector<int32_t> active;
  std::vector<int64_t> token;  // row -> token (relative to the pass)
  std::vector<int64_t> row;    // pair (t * k + j, relative) -> row
};

Groups group_pairs(const int32_t* ids, int64_t tokens, int64_t top_k, int64_t experts) {
  Groups g;
  const int64_t pairs = tokens * top_k;
  g.start.assign(experts, 0);
  g.count.assign(experts, 0);
  for (int64_t p = 0; p < pairs; ++p) ++g.count[ids[p]];
  int64_t at = 0;
  for (int64_t e = 0; e < experts; ++e) {
    g.start[e] = at;
    at += g.count[e];
    if (g.count[e] > 0) g.active.push_back(static_cast<int32_t>(e));
  }
  std::vector<int64_t> cursor(g.start);
  g.token.resize(pairs);
  g.row.resize(pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t r = cursor[ids[p]]++;
    g.token[r] = p / top_k;
    g.row[p] = r;
  }
  return g;
}

// Rows of x rounded to int8 per 32-wide block by the q8 path's rule (quant_q8_body.h), as quant_linear rounds them:
// xq [rows, k], xds [rows, k / 32, 2]. Each row's bits are its own.
void round_rows(const Q8Kernels& q8, const float* x, int64_t ldx, int64_t rows, int64_t k, int8_t* xq, float* xds) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / k), [&](int64_t begin, int64_t end) {
    q8.round(x + begin * ldx, ldx, end - begin, k, xq + begin * k, xds + 2 * begin * (k / 32));
  });
}

enum class Path { Q8X8, Q8Stream, Stream, Dequant, Dense };

// A range of one expert's output features, and what it costs (bytes read plus multiply-adds, for balancing).
struct Unit {
  int32_t expert;
  Path path;
  int64_t f0, f1;
  double cost;
};

// Scalar dense rows (no AVX2): each output one fp32 sum in k order.
void dense_scalar(const QuantArgs& a, Elem type, int64_t begin, int64_t end) {
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t f = begin; f < end; ++f) {
      const uint8_t* row = a.w + f * a.ldw;
      const float* x = a.x + r * a.ldx;
      float acc = 0.0f;
      for (int64_t j = 0; j < a.in_features; ++j) {
        float wv;
        if (type == Elem::F32) {
          std::memcpy(&wv, row + 4 * j, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, row + 2 * j, 2);
          wv = type == Elem::BF16 ? c10::detail::f32_from_bits(h) : c10::detail::fp16_ieee_to_fp32_value(h);
        }
        acc += wv * x[j];
      }
      static_cast<float*>(a.out)[r * a.out_features + f] = acc;
    }
}

// One projection over every active expert: `in` [rows, k] fp32 (exact and dense paths) or, for the q8 path, its
// rounded rows (xq, xds) in; `out` [rows, n] fp32.
void run_proj(const Proj& p, const Groups& g, const float* in, const int8_t* xq, const float* xds, float* out) {
  const QuantKernels& quant = quant_kernels_in_use();
  const Q8Kernels& q8 = q8_kernels_in_use();
  const DenseKernels* dense = std::strcmp(quant.name, "scalar") != 0 ? avx2_dense_kernels() : nullptr;
  const bool x8 = p.q8 && p.x8 != nullptr && q8.stream_x8 != nullptr;
  const QuantFn amx = x8 && std::strcmp(q8.name, "vnni") == 0 ? amx_x8_stream() : nullptr;
  const int64_t chunk = std::max<int64_t>(kQuantGroup, kScratchFloats / p.k / kQuantGroup * kQuantGroup);
  std::vector<Unit> units;
  double total = 0.0;
  for (const int32_t e : g.active) {
    const int64_t rows = g.count[e];
    Path path;
    int64_t step = kQuantGroup;
    if (p.dense) path = Path::Dense;
    else if (x8) path = Path::Q8X8, step = 16;
    else if (p.q8) path = Path::Q8Stream;
    else if (rows <= p.stream_rows) path = Path::Stream;
    else path = Path::Dequant, step = chunk;
    const double per_feature = static_cast<double>(p.row_bytes) + static_cast<double>(rows * p.k) / 8.0;
    for (int64_t f0 = 0; f0 < p.n; f0 += step) {
      const int64_t f1 = std::min(p.n, f0 + step);
      units.push_back({e, path, f0, f1, per_feature * static_cast<double>(f1 - f0)});
      total += units.back().cost;
    }
  }
  if (units.empty()) return;
  // Parts of about equal cost (consecutive units), as many as threads while each reads at least kPartBytes.
  const int64_t read = static_cast<int64_t>(g.active.size()) * p.n * p.row_bytes;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), read / kPartBytes));
  std::vector<size_t> first(static_cast<size_t>(parts) + 1, units.size());
  first[0] = 0;
  double before = 0.0;
  for (size_t i = 0, part = 0; i < units.size(); ++i) {
    const auto mine = static_cast<size_t>(
        std::min<double>(static_cast<double>(parts - 1), std::floor((before + units[i].cost / 2) * parts / total)));
    while (part < mine) first[++part] = i;
    before += units[i].cost;
  }
  auto call = [&](int32_t e, Path path, int64_t f0, int64_t f1) {
    const int64_t rows = g.count[e], r0 = g.start[e], blocks = p.k / 32;
    QuantArgs a{};
    a.x = in != nullptr ? in + r0 * p.k : nullptr;
    a.ldx = p.k;
    a.rows = rows;
    a.in_features = p.k;
    a.w = p.w + e * p.expert_bytes;
    a.ldw = p.ldw;
    a.format = p.format;
    a.scale = p.scale != nullptr ? p.scale + e * p.n : nullptr;
    a.out_features = p.n;
    a.out = out + r0 * p.n;
    a.out_type = Elem::F32;
    a.chunk = chunk;
    if (p.q8) {
      a.xq = xq + r0 * p.k;
      a.xds = xds + 2 * r0 * blocks;
    }
    switch (path) {
      case Path::Dense:
        if (dense != nullptr) dense->stream[static_cast<int>(p.w_type)](a, f0, f1);
        else dense_scalar(a, p.w_type, f0, f1);
        break;
      case Path::Stream: quant.stream(a, f0, f1); break;
      case Path::Dequant: quant.dequant_dot(a, f0, f1); break;
      case Path::Q8Stream: q8.stream(a, f0, f1); break;
      case Path::Q8X8: {
        a.w = p.x8 + e * p.x8_expert_bytes;
        // 16 rows at a time on AMX tiles where the CPU has them (the same bits, quant_amx.cpp), the rest on VNNI.
        const int64_t tiled = amx != nullptr ? rows / 16 * 16 : 0;
        if (tiled > 0) {
          QuantArgs head = a;
          head.rows = tiled;
          amx(head, f0, f1);
        }
        if (rows > tiled) {
          QuantArgs rest = a;
          rest.rows = rows - tiled;
          rest.xq = a.xq + tiled * p.k;
          rest.xds = a.xds + 2 * tiled * blocks;
          rest.out = out + (r0 + tiled) * p.n;
          q8.stream_x8(rest, f0, f1);
        }
        break;
      }
    }
  };
  at::parallel_for(0, parts, 1, [&](int64_t pb, int64_t pe) {
    const size_t last = first[static_cast<size_t>(pe)];
    for (size_t i = first[static_cast<size_t>(pb)]; i < last;) {
      size_t j = i + 1;  // consecutive units of one expert: one call
      while (j < last && units[j].expert == units[i].expert) ++j;
      call(units[i].expert, units[i].path, units[i].f0, units[j - 1].f1);
      i = j;
    }
  });
}

// The gated activation of h [rows, 2I] into a [rows, I]: silu by the layer kernels' silu_and_mul, tanh-GELU here.
void activate(const float* h, int64_t rows, int64_t inter, int64_t activation, float* a) {
  if (activation == 0) {
    const SiluArgs s{h, 2 * inter, Elem::F32, inter, a};
    const SiluFn fn = fused_kernels_in_use().silu_and_mul;
    at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / inter), [&](int64_t begin, int64_t end) {
      fn(s, begin, end);
    });
    return;
  }
  const DenseKernels* dense =
      std::strcmp(quant_kernels_in_use().name, "scalar") != 0 ? avx2_dense_kernels() : nullptr;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / inter), [&](int64_t begin, int64_t end) {
    if (dense != nullptr) {
      dense->gelu(h, inter, a, begin, end);
      return;
    }
    const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    for (int64_t t = begin; t < end; ++t)
      for (int64_t i = 0; i < inter; ++i) {
        const float x = h[t * 2 * inter + i];
        a[t * inter + i] = 0.5f * x * (1.0f + std::tanh(beta * (x + kappa * x * x * x))) * h[t * 2 * inter + inter + i];
      }
  });
}

float* floats(at::Tensor& t) { return t.data_ptr<float>(); }

}  // namespace

at::Tensor moe(const at::Tensor& x_in, const at::Tensor& weights_in, const at::Tensor& ids_in,
               const at::Tensor& gate_up, const std::optional<at::Tensor>& gate_up_scale,
               const std::optional<at::Tensor>& gate_up_x8, int64_t gate_up_fmt, int64_t gate_up_stream_rows,
               const at::Tensor& down, const std::optional<at::Tensor>& down_scale,
               const std::optional<at::Tensor>& down_x8, int64_t down_fmt, int64_t down_stream_rows,
               int64_t activation) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "paged_cpu.moe: x must be a 2-D cpu tensor [tokens, hidden], "
              "got shape ", x_in.sizes(), " on ", x_in.device());
  elem_of(x_in, "x");
  const int64_t tokens = x_in.size(0), hidden = x_in.size(1);
  TORCH_CHECK(ids_in.dim() == 2 && ids_in.size(0) == tokens && ids_in.scalar_type() == at::kInt &&
              weights_in.sizes() == ids_in.sizes() && weights_in.scalar_type() == at::kFloat,
              "paged_cpu.moe: weights and ids must be float32 and int32 [", tokens, ", k], got ",
              weights_in.scalar_type(), " ", weights_in.sizes(), " and ", ids_in.scalar_type(), " ", ids_in.sizes());
  TORCH_CHECK(activation == 0 || activation == 1, "paged_cpu.moe: activation must be 0 (silu) or 1 (gelu_tanh), got ",
              activation);
  TORCH_CHECK(hidden >= 1, "paged_cpu.moe: x has no features");
  const int64_t top_k = ids_in.size(1);
  // The layer's sizes from down: dense [E, H, I], or packed (E * H) rows of I inputs.
  int64_t experts, inter;
  if (down_fmt == kDenseFmt) {
    TORCH_CHECK(down.dim() == 3, "paged_cpu.moe: dense down must be [E, H, I], got shape ", down.sizes());
    experts = down.size(0);
    inter = down.size(2);
  } else {
    TORCH_CHECK(down_fmt >= 0 && down_fmt < kQuantFormats && down.dim() == 2 && down.size(0) % hidden == 0,
                "paged_cpu.moe: packed down must be (E * ", hidden, ") rows, got fmt ", down_fmt, " shape ",
                down.sizes());
    const QuantFormatInfo& info = kQuantFormatInfo[down_fmt];
    experts = down.size(0) / hidden;
    inter = down.size(1) / info.bytes * info.block;
  }
  TORCH_CHECK(experts >= 1 && inter >= 1, "paged_cpu.moe: down ", down.sizes(), " holds no experts");
  std::vector<at::Tensor> keep;
  const Proj gu = make_proj("gate_up", gate_up, gate_up_scale, gate_up_x8, gate_up_fmt, gate_up_stream_rows, experts,
                            2 * inter, hidden, keep);
  const Proj dn = make_proj("down", down, down_scale, down_x8, down_fmt, down_stream_rows, experts, hidden, inter, keep);

  const at::Tensor ids = ids_in.contiguous(), weights = weights_in.contiguous();
  const int32_t* id = ids.data_ptr<int32_t>();
  for (int64_t p = 0; p < tokens * top_k; ++p)
    TORCH_CHECK(id[p] >= 0 && id[p] < experts, "paged_cpu.moe: ids[", p / top_k, ", ", p % top_k, "] = ", id[p],
                " is not an expert (0 .. ", experts - 1, ")");
  // x in fp32 with unit stride within rows (a copy unless it is one already).
  at::Tensor x32 = x_in;
  if (x32.scalar_type() != at::kFloat || (hidden > 1 && x32.stride(1) != 1))
    x32 = at::empty({tokens, hidden}, x_in.options().dtype(at::kFloat)).copy_(x_in);
  const float* xf = x32.data_ptr<float>();
  const int64_t ldx = x32.stride(0);
  at::Tensor out32 = at::empty({tokens, hidden}, x_in.options().dtype(at::kFloat));
  if (tokens == 0 || top_k == 0) {
    if (top_k == 0) out32.zero_();
    return x_in.scalar_type() == at::kFloat ? out32 : out32.to(x_in.scalar_type());
  }
  const Q8Kernels& q8 = q8_kernels_in_use();
  const auto f32 = x_in.options().dtype(at::kFloat);
  const auto i8 = x_in.options().dtype(at::kChar);
  const int64_t per_pair = hidden + 2 * inter + inter + hidden;
  const int64_t pass_tokens = std::max<int64_t>(1, kPassFloats / (per_pair * top_k));
  float* o = floats(out32);
  const float* w = weights.data_ptr<float>();
  const int64_t hb = hidden / 32, ib = inter / 32;
  for (int64_t t0 = 0; t0 < tokens; t0 += pass_tokens) {
    const int64_t tn = std::min(pass_tokens, tokens - t0), rows = tn * top_k;
    const Groups g = group_pairs(id + t0 * top_k, tn, top_k, experts);
    // gate_up's input: the pairs' x rows gathered (exact and dense paths), or rounded once per token and gathered.
    at::Tensor xs, xq, xds;
    if (!gu.q8) {
      xs = at::empty({rows, hidden}, f32);
      float* dst = floats(xs);
      at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / hidden), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          std::memcpy(dst + r * hidden, xf + (t0 + g.token[r]) * ldx, sizeof(float) * hidden);
      });
    } else {
      at::Tensor tq = at::empty({tn, hidden}, i8), td = at::empty({tn, hb, 2}, f32);
      xq = at::empty({rows, hidden}, i8);
      xds = at::empty({rows, hb, 2}, f32);
      round_rows(q8, xf + t0 * ldx, ldx, tn, hidden, tq.data_ptr<int8_t>(), floats(td));
      const int8_t* sq = tq.data_ptr<int8_t>();
      const float* sd = floats(td);
      int8_t* dq = xq.data_ptr<int8_t>();
      float* dd = floats(xds);
      at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / hidden), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          std::memcpy(dq + r * hidden, sq + g.token[r] * hidden, hidden);
          std::memcpy(dd + 2 * r * hb, sd + 2 * g.token[r] * hb, sizeof(float) * 2 * hb);
        }
      });
    }
    at::Tensor h = at::empty({rows, 2 * inter}, f32);
    run_proj(gu, g, xs.defined() ? floats(xs) : nullptr, xq.defined() ? xq.data_ptr<int8_t>() : nullptr,
             xds.defined() ? floats(xds) : nullptr, floats(h));
    at::Tensor act = at::empty({rows, inter}, f32);
    activate(floats(h), rows, inter, activation, floats(act));
    // down's input: the activations, rounded per row for the q8 path.
    at::Tensor aq, ad;
    if (dn.q8) {
      aq = at::empty({rows, inter}, i8);
      ad = at::empty({rows, ib, 2}, f32);
      round_rows(q8, floats(act), inter, rows, inter, aq.data_ptr<int8_t>(), floats(ad));
    }
    at::Tensor y = at::empty({rows, hidden}, f32);
    run_proj(dn, g, floats(act), aq.defined() ? aq.data_ptr<int8_t>() : nullptr, aq.defined() ? floats(ad) : nullptr,
             floats(y));
    // Each token's slots in order: acc = y_0 w_0, then acc + y_j w_j (a product, then a sum: no fused multiply-add
    // in this translation unit's baseline target), as the reference.
    const float* yy = floats(y);
    at::parallel_for(0, tn, std::max<int64_t>(1, 16384 / (hidden * top_k)), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        float* dst = o + (t0 + t) * hidden;
        const float* wt = w + (t0 + t) * top_k;
        const float* y0 = yy + g.row[t * top_k] * hidden;
        for (int64_t i = 0; i < hidden; ++i) dst[i] = y0[i] * wt[0];
        for (int64_t j = 1; j < top_k; ++j) {
          const float* yj = yy + g.row[t * top_k + j] * hidden;
          const float wj = wt[j];
          for (int64_t i = 0; i < hidden; ++i) dst[i] = dst[i] + yj[i] * wj;
        }
      }
    });
  }
  return x_in.scalar_type() == at::kFloat ? out32 : out32.to(x_in.scalar_type());
}

}  // namespace paged_cpu

TORCH_LIBRARY_FRAGMENT(paged_cpu, m) {
  m.def("moe(Tensor x, Tensor weights, Tensor ids, Tensor gate_up, Tensor? gate_up_scale, Tensor? gate_up_x8, "
        "int gate_up_fmt, int gate_up_stream_rows, Tensor down, Tensor? down_scale, Tensor? down_x8, int down_fmt, "
        "int down_stream_rows, int activation) -> Tensor");
}

TORCH_LIBRARY_IMPL(paged_cpu, CPU, m) { m.impl("moe", &paged_cpu::moe); }
