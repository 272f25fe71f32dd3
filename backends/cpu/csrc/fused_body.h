// The element-wise layer kernels (rms_norm, add_rms_norm, silu_and_mul, rotary, rotate_heads) as portable C++.
//
// Included inside a per-ISA namespace by fused_scalar.cpp (baseline target) and fused_avx2.cpp
// (under `#pragma GCC target`), so that each copy of these inline functions is compiled for, and
// only ever called from, its own instruction set (linear_avx2.cpp includes it too, in a namespace
// of its own, for the shared linear pieces at the end). The loops are written for GCC's vectoriser:
// conversions are branch-free bit arithmetic, and reductions keep 16 independent partial sums.
// Both includers set `#pragma GCC optimize("no-trapping-math")` around it: with trapping math
// GCC will not if-convert a select that follows float arithmetic, and leaves exp, the fp16
// conversions and every clamp scalar (the kernels never read the floating-point status flags).
// No floating-point contraction is relied on, and none may happen: the AVX2 copy is compiled
// without FMA so that a * b - c * d rounds exactly as the pure-torch reference does.
//
// Needs <cmath>, <cstdint>, <cstring>, <algorithm> and fused_api.h included before.

template <Elem E>
using Store = typename std::conditional<E == Elem::F32, float, uint16_t>::type;

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// bf16 -> fp32 is exact: the 16 bits are the top half of the fp32 value.
inline float from_bf16(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// fp32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN.
inline uint16_t to_bf16(float f) {
  const uint32_t b = float_to_bits(f);
  const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  const uint32_t nan = (b >> 16) | 0x40u;
  return static_cast<uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// IEEE half -> fp32, exact for every input. Every case is chosen on integers and one subtraction
// finishes subnormals: 2^-14 * (1 + m / 1024) - 2^-14 = m * 2^-24, exactly.
inline float from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = (h & 0x3ffu) << 13;
  const uint32_t bits = exp == 0 ? (113u << 23) | man : (exp == 0x1fu ? 0x7f800000u | man : ((exp + 112u) << 23) | man);
  const float mag = bits_to_float(bits) - bits_to_float(exp == 0 ? 0x38800000u : 0u);
  return bits_to_float(float_to_bits(mag) | sign);
}

// fp32 -> IEEE half, round to nearest even (ties to even at every magnitude, overflow to infinity).
inline uint16_t to_f16(float f) {
  const uint32_t b = float_to_bits(f);
  const uint32_t sign = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
  // Normal halves: rebias the exponent (127 -> 15), round the 13 dropped mantissa bits to even.
  const uint32_t normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Below 2^-14 the result is a subnormal: |f| + 0.5 has an ulp of 2^-24, so the hardware's
  // round-to-nearest-even addition leaves round(|f| / 2^-24) in the low mantissa bits.
  const uint32_t sub = float_to_bits(bits_to_float(a) + 0.5f) - 0x3f000000u;
  uint32_t r = a < 0x38800000u ? sub : normal;
  r = a >= 0x477ff000u ? 0x7c00u : r;  // 65520 and above round to infinity
  r = a > 0x7f800000u ? 0x7e00u : r;   // NaN
  return static_cast<uint16_t>(sign | r);
}

template <Elem E>
inline float load(const Store<E>* p, int64_t i) {
  if constexpr (E == Elem::F32) return p[i];
  else if constexpr (E == Elem::BF16) return from_bf16(p[i]);
  else return from_f16(p[i]);
}

template <Elem E>
inline Store<E> round_to(float v) {
  if constexpr (E == Elem::F32) return v;
  else if constexpr (E == Elem::BF16) return to_bf16(v);
  else return to_f16(v);
}

// Whole fp16 rows to and from fp32: the one primitive each includer defines after this file
// (portable loops over from_f16 / to_f16, or the F16C instructions).
void f16_to_float_row(const uint16_t* src, int64_t n, float* dst);
void float_to_f16_row(const float* src, int64_t n, uint16_t* dst);

// n values of a runtime-typed array to fp32.
inline void to_float(const void* src, Elem type, int64_t n, float* dst) {
  switch (type) {
    case Elem::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); break;
    case Elem::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load<Elem::BF16>(static_cast<const uint16_t*>(src), i);
      break;
    case Elem::F16: f16_to_float_row(static_cast<const uint16_t*>(src), n, dst); break;
  }
}

// A small fp32 scratch row: on the stack up to 2048 values, else on the heap.
class Scratch {
 public:
  explicit Scratch(int64_t n) : heap_(n > kStack ? new float[static_cast<size_t>(n)] : nullptr) {}
  ~Scratch() { delete[] heap_; }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() { return heap_ != nullptr ? heap_ : stack_; }

 private:
  static constexpr int64_t kStack = 2048;
  float* heap_;
  float stack_[kStack];
};

// Sum of squares of one row, 16 independent partial sums (vectorisable without reassociation).
template <Elem E>
inline float sum_squares(const Store<E>* x, int64_t n) {
  float part[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) {
      const float v = load<E>(x, i + j);
      part[j] += v * v;
    }
  for (int j = 0; i + j < n; ++j) {
    const float v = load<E>(x, i + j);
    part[j] += v * v;
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) part[j] += part[j + w];
  return part[0];
}

// fp16 rows go through fp32 scratch rows (below, kF16Chunk values at a time), converted by the
// row primitives: GCC gives up on the kernels' loops with the fp16 bit conversions inside (mixed
// 16- and 32-bit selects), and F16C converts 8 values per instruction where the CPU has it.
constexpr int64_t kF16Chunk = 1024;

inline void round_f16(const float* src, int64_t n, uint16_t* dst) { float_to_f16_row(src, n, dst); }

// One row: out = x / sqrt(mean(x^2) + eps) * w; with a residual, sum = x + r (rounded) is what is normalised.
template <Elem E>
void rms_row(const Store<E>* x, const Store<E>* r, Store<E>* sum, Store<E>* out, const float* w, int64_t h, float eps) {
  if (r != nullptr) {
    // The sum is rounded to the input type first (it is an output), and normalised as rounded.
    for (int64_t i = 0; i < h; ++i) sum[i] = round_to<E>(load<E>(x, i) + load<E>(r, i));
    x = sum;  // still in L1: the second read costs no memory traffic
  }
  const float inv = 1.0f / std::sqrt(sum_squares<E>(x, h) / static_cast<float>(h) + eps);
  for (int64_t i = 0; i < h; ++i) out[i] = round_to<E>(load<E>(x, i) * inv * w[i]);
}

template <Elem E>
void rms_rows(const RmsArgs& a, int64_t begin, int64_t end) {
  using S = Store<E>;
  const int64_t h = a.hidden;
  Scratch wbuf(h);
  float* w = wbuf.data();
  to_float(a.weight, a.w_type, h, w);
  Scratch xs(E == Elem::F16 ? h : 0), rs(E == Elem::F16 ? h : 0);
  for (int64_t t = begin; t < end; ++t) {
    const S* x = static_cast<const S*>(a.x) + t * a.x_stride;
    const S* r = a.residual != nullptr ? static_cast<const S*>(a.residual) + t * a.r_stride : nullptr;
    S* sum = a.residual != nullptr ? static_cast<S*>(a.sum) + t * h : nullptr;
    S* out = static_cast<S*>(a.out) + t * h;
    if constexpr (E == Elem::F16) {
      float* xf = xs.data();
      to_float(x, Elem::F16, h, xf);
      if (r != nullptr) {
        to_float(r, Elem::F16, h, rs.data());
        for (int64_t i = 0; i < h; ++i) xf[i] += rs.data()[i];
        round_f16(xf, h, sum);
        to_float(sum, Elem::F16, h, xf);
      }
      rms_row<Elem::F32>(xf, nullptr, nullptr, rs.data(), w, h, a.eps);
      round_f16(rs.data(), h, out);
    } else {
      rms_row<E>(x, r, sum, out, w, h, a.eps);
    }
  }
}

// e^x in fp32 to about 1 ulp: x = n ln2 + r (two-constant reduction), e^r by its degree-7 Taylor
// polynomial on |r| <= ln2 / 2, then two exact power-of-two scalings (each half of n stays a normal
// exponent, so results down in the subnormals and overflow to infinity both come out right).
inline float exp_f32(float x) {
  // Clamp to [-104, 89] on the magnitude's bits (their unsigned order is the float order): an
  // unsigned min is one vector instruction, where GCC if-converts a float clamp by computing the
  // caller's whole expression once per clamp branch. A NaN comes out finite here; the callers keep
  // x itself in their result, which stays NaN.
  const uint32_t b = float_to_bits(x), sign = b & 0x80000000u, mag = b & 0x7fffffffu;
  const uint32_t limit = sign != 0 ? 0x42d00000u : 0x42b20000u;  // 104.0f, 89.0f
  x = bits_to_float(sign | (mag < limit ? mag : limit));
  const float fn = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest integer
  const float r = (x - fn * 0.693145751953125f) - fn * 1.428606765330187e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n = static_cast<int32_t>(fn), n1 = n >> 1, n2 = n - n1;
  const float s1 = bits_to_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_float(static_cast<uint32_t>(n2 + 127) << 23);
  return p * s1 * s2;
}

template <Elem E>
void silu_row(const Store<E>* gate, const Store<E>* up, Store<E>* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = load<E>(gate, i);
    const float silu = g / (1.0f + exp_f32(-g));
    out[i] = round_to<E>(silu * load<E>(up, i));
  }
}

template <Elem E>
void silu_rows(const SiluArgs& a, int64_t begin, int64_t end) {
  using S = Store<E>;
  const int64_t n = a.inter;
  Scratch buf(E == Elem::F16 ? 3 * kF16Chunk : 0);
  for (int64_t t = begin; t < end; ++t) {
    const S* gate = static_cast<const S*>(a.x) + t * a.x_stride;
    S* out = static_cast<S*>(a.out) + t * n;
    if constexpr (E == Elem::F16) {
      float *g = buf.data(), *u = g + kF16Chunk, *o = u + kF16Chunk;
      for (int64_t i = 0; i < n; i += kF16Chunk) {
        const int64_t m = n - i < kF16Chunk ? n - i : kF16Chunk;
        to_float(gate + i, Elem::F16, m, g);
        to_float(gate + n + i, Elem::F16, m, u);
        silu_row<Elem::F32>(g, u, o, m);
        round_f16(o, m, out + i);
      }
    } else {
      silu_row<E>(gate, gate + n, out, n);
    }
  }
}

// One head: (a, b) = its halves -> (a cos - b sin, b cos + a sin).
template <Elem E>
void rotate_head(const Store<E>* src, Store<E>* dst, int64_t half, const float* cos, const float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    const float lo = load<E>(src, i), hi = load<E>(src, half + i);
    dst[i] = round_to<E>(lo * cos[i] - hi * sin[i]);
    dst[half + i] = round_to<E>(hi * cos[i] + lo * sin[i]);
  }
}

// One token's heads of query or key; fp16 heads through fp32 scratch (2 * d floats).
template <Elem E>
void rotate_heads(const RotaryTensor& x, int64_t t, int64_t d, const float* cos, const float* sin, float* scratch) {
  using S = Store<E>;
  for (int64_t hd = 0; hd < x.heads; ++hd) {
    const S* src = static_cast<const S*>(x.src) + t * x.token_stride + hd * x.head_stride;
    S* dst = static_cast<S*>(x.dst) + (t * x.heads + hd) * d;
    if constexpr (E == Elem::F16) {
      to_float(src, Elem::F16, d, scratch);
      rotate_head<Elem::F32>(scratch, scratch + d, d / 2, cos, sin);
      round_f16(scratch + d, d, dst);
    } else {
      rotate_head<E>(src, dst, d / 2, cos, sin);
    }
  }
}

inline void rotate_any(const RotaryTensor& x, int64_t t, int64_t d, const float* cos, const float* sin,
                       float* scratch) {
  switch (x.type) {
    case Elem::F32: rotate_heads<Elem::F32>(x, t, d, cos, sin, scratch); break;
    case Elem::BF16: rotate_heads<Elem::BF16>(x, t, d, cos, sin, scratch); break;
    case Elem::F16: rotate_heads<Elem::F16>(x, t, d, cos, sin, scratch); break;
  }
}

inline void rotary_rows(const RotaryArgs& a, int64_t begin, int64_t end) {
  const int64_t d = a.head_size;
  const int64_t esize = a.cache_type == Elem::F32 ? 4 : 2;
  Scratch buf(3 * d);
  float* cs = buf.data();
  for (int64_t t = begin; t < end; ++t) {
    const char* row = static_cast<const char*>(a.cache) + a.positions[t] * a.cache_stride * esize;
    to_float(row, a.cache_type, d, cs);
    rotate_any(a.q, t, d, cs, cs + d / 2, cs + d);
    rotate_any(a.k, t, d, cs, cs + d / 2, cs + d);
  }
}

inline void rms_any(const RmsArgs& a, int64_t begin, int64_t end) {
  switch (a.type) {
    case Elem::F32: rms_rows<Elem::F32>(a, begin, end); break;
    case Elem::BF16: rms_rows<Elem::BF16>(a, begin, end); break;
    case Elem::F16: rms_rows<Elem::F16>(a, begin, end); break;
  }
}

inline void silu_any(const SiluArgs& a, int64_t begin, int64_t end) {
  switch (a.type) {
    case Elem::F32: silu_rows<Elem::F32>(a, begin, end); break;
    case Elem::BF16: silu_rows<Elem::BF16>(a, begin, end); break;
    case Elem::F16: silu_rows<Elem::F16>(a, begin, end); break;
  }
}

// ---- rotate_heads: the fast Walsh-Hadamard butterfly (paged_core.reference.fused.hadamard_butterfly) ----
//
// Each vector is converted to fp32, then within each block of b values stages h = 1, 2, 4, ..., b / 2 replace
// every pair (v[j], v[j + h]) of a 2h-wide group by (v[j] + v[j + h], v[j] - v[j + h]); then each value is
// multiplied by the scale and rounded once. Each result is one rounded operation on the same two operands as in
// the reference, so the bits are the reference's whatever the vector width (a + b and b + a are the same IEEE
// sum) and whatever other rows share the call.

// One vector: out[0, d) = in[0, d) times R(D), both of `type`, in fp32 and rounded once (`scratch` holds d floats).
// Each includer defines it after this file: blocks in registers where the vectors have 8 lanes, else
// hadamard_vector_loops.
void hadamard_vector(const void* in, void* out, Elem type, int64_t d, int64_t b, float scale, float* scratch);

// n pairs (lo[j], hi[j]) -> (lo[j] + hi[j], lo[j] - hi[j]); the halves never overlap.
inline void butterfly(float* __restrict__ lo, float* __restrict__ hi, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float a = lo[j], c = hi[j];
    lo[j] = a + c;
    hi[j] = a - c;
  }
}

// Stage H (1, 2 or 4) over v[0, d): groups of a fixed size, which the compiler unrolls (a call per group is slow).
template <int H>
inline void small_stage(float* v, int64_t d) {
  for (int64_t i = 0; i < d; i += 2 * H)
    for (int j = 0; j < H; ++j) {
      const float a = v[i + j], c = v[i + j + H];
      v[i + j] = a + c;
      v[i + j + H] = a - c;
    }
}

// Stages h = from, 2 from, ..., b / 2 over v[0, d) (every 2h-wide group lies in one block).
inline void hadamard_stages(float* v, int64_t d, int64_t from, int64_t b) {
  for (int64_t h = from; h < b; h *= 2) {
    if (h == 1) small_stage<1>(v, d);
    else if (h == 2) small_stage<2>(v, d);
    else if (h == 4) small_stage<4>(v, d);
    else
      for (int64_t i = 0; i < d; i += 2 * h) butterfly(v + i, v + i + h, h);
  }
}

// out = v * scale, rounded once to E.
template <Elem E>
inline void hadamard_store(float* v, Store<E>* out, int64_t d, float scale) {
  if constexpr (E == Elem::F16) {
    for (int64_t i = 0; i < d; ++i) v[i] *= scale;
    round_f16(v, d, out);
  } else {
    for (int64_t i = 0; i < d; ++i) out[i] = round_to<E>(v[i] * scale);
  }
}

template <Elem E>
void hadamard_loops(const Store<E>* in, Store<E>* out, int64_t d, int64_t b, float scale, float* v) {
  to_float(in, E, d, v);
  hadamard_stages(v, d, 1, b);
  hadamard_store<E>(v, out, d, scale);
}

inline void hadamard_vector_loops(const void* in, void* out, Elem type, int64_t d, int64_t b, float scale,
                                  float* scratch) {
  switch (type) {
    case Elem::F32:
      hadamard_loops<Elem::F32>(static_cast<const float*>(in), static_cast<float*>(out), d, b, scale, scratch);
      break;
    case Elem::BF16:
      hadamard_loops<Elem::BF16>(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), d, b, scale, scratch);
      break;
    case Elem::F16:
      hadamard_loops<Elem::F16>(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), d, b, scale, scratch);
      break;
  }
}

inline void hadamard_any(const HadamardArgs& a, int64_t begin, int64_t end) {
  const int64_t d = a.head_size, esize = a.type == Elem::F32 ? 4 : 2;
  Scratch buf(d);
  for (int64_t t = begin; t < end; ++t)
    for (int64_t hd = 0; hd < a.heads; ++hd) {
      const char* src = static_cast<const char*>(a.src) + (t * a.token_stride + hd * a.head_stride) * esize;
      char* dst = static_cast<char*>(a.dst) + (t * a.heads + hd) * d * esize;
      hadamard_vector(src, dst, a.type, d, a.block, a.scale, buf.data());
    }
}

// ---- linear: shared pieces of the panel kernels ----

constexpr int kMaxTileRows = 6;  // output rows one register tile covers (6 x 16 fp32 = 12 AVX2 registers)

// Features 0..15 of one bf16 panel row in order (the layout interleaves them, see fused_api.h).
template <Elem W>
inline void panel_row(const Store<W>* p, float* w) {
  if constexpr (W == Elem::BF16) {
    for (int j = 0; j < 8; ++j) {
      w[j] = from_bf16(p[2 * j]);
      w[8 + j] = from_bf16(p[2 * j + 1]);
    }
  } else {
    for (int j = 0; j < kPanel; ++j) w[j] = load<W>(p, j);
  }
}

// Output rows r0 .. r0 + rows of panel p from the fp32 sums acc[rows][16], plus the bias, rounded once.
inline void store_panel(const LinearArgs& a, const float* acc, int rows, int64_t r0, int64_t p) {
  const int64_t n0 = p * kPanel, n = a.out_features;
  const int cols = static_cast<int>(n - n0 < kPanel ? n - n0 : kPanel);
  for (int r = 0; r < rows; ++r) {
    float v[kPanel];
    for (int j = 0; j < kPanel; ++j) v[j] = acc[r * kPanel + j];
    if (a.bias != nullptr)
      for (int j = 0; j < cols; ++j) v[j] += a.bias[n0 + j];
    const int64_t at = (r0 + r) * n + n0;
    switch (a.out_type) {
      case Elem::F32:
        for (int j = 0; j < cols; ++j) static_cast<float*>(a.out)[at + j] = v[j];
        break;
      case Elem::BF16:
        for (int j = 0; j < cols; ++j) static_cast<uint16_t*>(a.out)[at + j] = to_bf16(v[j]);
        break;
      case Elem::F16:
        for (int j = 0; j < cols; ++j) static_cast<uint16_t*>(a.out)[at + j] = to_f16(v[j]);
        break;
    }
  }
}

// The rows of the output split into register tiles of at most kMaxTileRows, as even as possible
// (8 rows: 4 + 4, not 6 + 2); fn(tile_rows as a compile-time constant, first row).
template <typename Fn>
inline void for_row_tiles(int64_t m, const Fn& fn) {
  const int64_t tiles = (m + kMaxTileRows - 1) / kMaxTileRows;
  int64_t r0 = 0;
  for (int64_t i = 0; i < tiles; ++i) {
    const int rows = static_cast<int>((m - r0) / (tiles - i) + ((m - r0) % (tiles - i) != 0));
    switch (rows) {
      case 1: fn(std::integral_constant<int, 1>(), r0); break;
      case 2: fn(std::integral_constant<int, 2>(), r0); break;
      case 3: fn(std::integral_constant<int, 3>(), r0); break;
      case 4: fn(std::integral_constant<int, 4>(), r0); break;
      case 5: fn(std::integral_constant<int, 5>(), r0); break;
      default: fn(std::integral_constant<int, 6>(), r0); break;
    }
    r0 += rows;
  }
}
