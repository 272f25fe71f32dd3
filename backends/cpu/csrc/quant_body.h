// Linear products over packed weights (q4_0, q4_1, q8_0, q4_k, q6_k, int8) as one portable algorithm.
//
// Included inside a per-ISA namespace (quant_scalar.cpp, quant_avx2.cpp, quant_avx512.cpp) after
// fused_body.h and the ISA's primitives on kLanes lanes (8 or 16; a constexpr int the ISA defines):
//   VF (fp32) and VI (int32) vectors; vzero(), vset1(float), vload(const float*), vstore(float*, VF),
//   vfma(a, b, c) = a * b + c, vmul(a, b), vadd(a, b), vsum(VF) -> float, vsum4(a, b, c, d, float* out)
//   (the four sums to out[0 .. 3]);
//   vu8(p) / vi8(p): kLanes bytes at p zero- / sign-extended to int32; vand(VI, int), vsrl(VI, int)
//   (logical), vsll(VI, int), vor(VI, VI), vsubi(VI, int), vcvt(VI) -> VF (exact: |values| < 2^24);
//   f16_at(p): the fp16 at byte p as fp32; vset1_f16(p): the same in every lane.
//
// Weights are dequantized exactly as paged_core.quant.dequant does, in fp32: every format's weight is
// d * q (+ m) with an fp16 (or fp16 x 6-bit, fp16 x int8) scale and a small integer q, so the products
// are exact and the one addition of q4_1 / q4_k rounds the same with or without a fused multiply-add;
// int8's scale * q is one fp32 product, rounded as torch rounds it. The dot products are fp32 sums of
// weight x activation in an order of their own (kLanes lanes, then a horizontal sum). No activation is
// rounded to a lower precision.
//

template <int N>
using Int = std::integral_constant<int, N>;

// The decoders and the unrolled loop bodies must inline into the tile (GCC's size limits stop at the
// largest tiles otherwise, and a call per decoded vector costs more than the vector).
#ifndef PAGED_FORCE_INLINE
#define PAGED_FORCE_INLINE __attribute__((always_inline))
#endif

// f(Int<i>()) for i = 0 .. N-1 as straight-line code, so that accumulator indices are constants and the
// accumulators stay in registers.
template <int N, typename F>
PAGED_FORCE_INLINE inline void unroll(const F& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) PAGED_FORCE_INLINE { (f(Int<I>()), ...); }(
      std::make_integer_sequence<int, N>());
}

// ---- formats ----
//
// A format's block (kBlock weights in kBytes) is read in steps of kStep weights (k = s * kStep .. of the
// block, step s), each decoded as kStep / kLanes vectors in k order:
//   prepare(block, args, n, state)   once per block and feature (q4_k, q6_k: the sub-block scales);
//   scales(block, state, s)          per step, right before its vectors (a few registers: the fp16 scale
//                                    broadcast and converted, or a reference to the prepared state);
//   decode<V>(block, scales, s)      vector V of step s: weights kLanes * V .. of the step.
// Steps whose vectors share bytes (low and high nibbles of the same bytes) are one step, so that the
// compiler loads those bytes once.

struct FmtQ4_0 {  // f16 d, 16 bytes: w[j] = d * ((qs[j] & 15) - 8), w[j + 16] = d * ((qs[j] >> 4) - 8)
  static constexpr int kBlock = 32, kBytes = 18, kStep = 32;
  static constexpr bool kTail = false, kFeatureOuter = true, kPrefetch = true;
  struct State {};
  struct Scales { VF d, m; };
  PAGED_FORCE_INLINE static void prepare(const uint8_t*, const QuantArgs&, int64_t, State&) {}
  PAGED_FORCE_INLINE static Scales scales(const uint8_t* b, const State&, int) {
    const VF d = vset1_f16(b);
    return {d, vmul(d, vset1(-8.0f))};  // d * q - 8d = d * (q - 8), exact: fused or not, the same
  }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const Scales& s, int) {
    constexpr int w0 = kLanes * V;  // weights 0-15: low nibbles of bytes 0-15; 16-31: high nibbles
    const VI q = vu8(b + 2 + w0 % 16);
    return vfma(vcvt(w0 < 16 ? vand(q, 15) : vsrl(q, 4)), s.d, s.m);
  }
};

struct FmtQ4_1 {  // f16 d, f16 m, 16 bytes: w = d * q + m
  static constexpr int kBlock = 32, kBytes = 20, kStep = 32;
  static constexpr bool kTail = false, kFeatureOuter = true, kPrefetch = true;
  struct State {};
  struct Scales { VF d, m; };
  PAGED_FORCE_INLINE static void prepare(const uint8_t*, const QuantArgs&, int64_t, State&) {}
  PAGED_FORCE_INLINE static Scales scales(const uint8_t* b, const State&, int) {
    return {vset1_f16(b), vset1_f16(b + 2)};
  }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const Scales& s, int) {
    constexpr int w0 = kLanes * V;
    const VI q = vu8(b + 4 + w0 % 16);
    return vfma(vcvt(w0 < 16 ? vand(q, 15) : vsrl(q, 4)), s.d, s.m);
  }
};

struct FmtQ8_0 {  // f16 d, 32 int8: w = d * q; streamed one weight row at a time (stream_width)
  static constexpr int kBlock = 32, kBytes = 34, kStep = 32, kWidth = 1, kAccSplit = 2;
  static constexpr bool kTail = false, kFeatureOuter = true, kPrefetch = true;
  struct State {};
  struct Scales { VF d; };
  PAGED_FORCE_INLINE static void prepare(const uint8_t*, const QuantArgs&, int64_t, State&) {}
  PAGED_FORCE_INLINE static Scales scales(const uint8_t* b, const State&, int) { return {vset1_f16(b)}; }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const Scales& s, int) {
    return vmul(vcvt(vi8(b + 2 + kLanes * V)), s.d);
  }
};

// q4_k: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles: sub-block j (32 weights)
// is the low (j even) or high (j odd) nibbles of bytes 32 * (j / 2) .. + 31; w = (d * sc_j) * q - dmin * m_j.
// A step is a pair of sub-blocks (64 weights from the same 32 bytes).
struct FmtQ4_K {
  static constexpr int kBlock = 256, kBytes = 144, kStep = 64;
  static constexpr bool kTail = false, kFeatureOuter = true, kPrefetch = true;
  struct State { float scale[8], neg_min[8]; };
  using Scales = const State&;
  PAGED_FORCE_INLINE static void prepare(const uint8_t* b, const QuantArgs&, int64_t, State& s) {
    // The 6-bit fields of 4 sub-blocks at a time, bytewise in 32-bit words (little-endian): scales of
    // sub-blocks 0-3 are the low 6 bits of bytes 0-3, 4-7 the low nibbles of bytes 8-11 with the top
    // 2 bits of bytes 0-3 above them; mins likewise from bytes 4-7 and the high nibbles of 8-11.
    uint32_t u[3];
    std::memcpy(u, b + 4, 12);
    const uint32_t f[4] = {u[0] & 0x3f3f3f3fu, (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u),
                           u[1] & 0x3f3f3f3fu, ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u)};
    uint8_t bytes[16];
    std::memcpy(bytes, f, 16);
    const float d = f16_at(b), neg_dmin = -f16_at(b + 2);
    for (int j = 0; j < 8; ++j) {  // (d * sc) and (-dmin * m): one rounded fp32 product each, as the reference
      s.scale[j] = static_cast<float>(bytes[j]) * d;
      s.neg_min[j] = static_cast<float>(bytes[8 + j]) * neg_dmin;
    }
  }
  PAGED_FORCE_INLINE static Scales scales(const uint8_t*, const State& st, int) { return st; }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const State& st, int s) {
    constexpr int w0 = kLanes * V, high = w0 >= 32;  // weights 0-31: sub-block 2s (low nibbles), 32-63: 2s + 1
    const VI q = vu8(b + 16 + 32 * s + w0 % 32);
    const int j = 2 * s + high;
    return vfma(vcvt(high ? vsrl(q, 4) : vand(q, 15)), vset1(st.scale[j]), vset1(st.neg_min[j]));
  }
};

// q6_k: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8 scales, f16 d. Half h of 128
// weights, quarter i of 32, l = 0 .. 31: low = nibble (i >= 2) of ql[64h + 32(i % 2) + l], high = bits
// 2i, 2i + 1 of qh[32h + l], w = d * scales[8h + 2i + l / 16] * ((low | high << 4) - 32). A step is a
// half (its four quarters share ql and qh bytes; the shifts are then constants).
struct FmtQ6_K {
  static constexpr int kBlock = 256, kBytes = 210, kStep = 128;
  static constexpr bool kTail = false, kFeatureOuter = true, kPrefetch = true;
  struct State { float scale[16]; };
  using Scales = const State&;
  PAGED_FORCE_INLINE static void prepare(const uint8_t* b, const QuantArgs&, int64_t, State& s) {
    const float d = f16_at(b + 208);
    for (int j = 0; j < 16; ++j) s.scale[j] = static_cast<float>(static_cast<int8_t>(b[192 + j])) * d;
  }
  PAGED_FORCE_INLINE static Scales scales(const uint8_t*, const State& st, int) { return st; }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const State& st, int h) {
    constexpr int i = kLanes * V / 32, l0 = kLanes * V % 32;  // quarter, first weight within the quarter
    const VI ql = vu8(b + 64 * h + 32 * (i & 1) + l0);
    const VI low = i >= 2 ? vsrl(ql, 4) : vand(ql, 15);
    const VI high = vand(vsrl(vu8(b + 128 + 32 * h + l0), 2 * i), 3);
    const VI q = vsubi(vor(low, vsll(high, 4)), 32);
    return vmul(vcvt(q), vset1(st.scale[8 * h + 2 * i + l0 / 16]));  // 16 weights per scale: one per vector
  }
};

// int8 weight-only: K int8 per row and one fp32 scale per row; runs of 32, the last K % 32 one by one.
struct FmtInt8 {
  static constexpr int kBlock = 32, kBytes = 32, kStep = 32;
  static constexpr bool kTail = true, kFeatureOuter = true, kPrefetch = true;
  struct State { float s; };
  struct Scales { VF s; };
  PAGED_FORCE_INLINE static void prepare(const uint8_t*, const QuantArgs& a, int64_t n, State& s) { s.s = a.scale[n]; }
  PAGED_FORCE_INLINE static Scales scales(const uint8_t*, const State& st, int) { return {vset1(st.s)}; }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const Scales& s, int) {
    return vmul(vcvt(vi8(b + kLanes * V)), s.s);
  }
  PAGED_FORCE_INLINE static float weight(const uint8_t* row, const QuantArgs& a, int64_t n, int64_t k) {
    return static_cast<float>(static_cast<int8_t>(row[k])) * a.scale[n];
  }
};

// fp32 rows already dequantized (the scratch of the dequantize path).
struct FmtF32 {
  static constexpr int kBlock = 32, kBytes = 128, kStep = 32;
  static constexpr bool kTail = true, kFeatureOuter = false, kPrefetch = false;
  struct State {};
  struct Scales {};
  PAGED_FORCE_INLINE static void prepare(const uint8_t*, const QuantArgs&, int64_t, State&) {}
  PAGED_FORCE_INLINE static Scales scales(const uint8_t*, const State&, int) { return {}; }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const Scales&, int) {
    return vload(reinterpret_cast<const float*>(b) + kLanes * V);
  }
  PAGED_FORCE_INLINE static float weight(const uint8_t* row, const QuantArgs&, int64_t, int64_t k) {
    return reinterpret_cast<const float*>(row)[k];
  }
};

// How many tiles ahead the packed rows are fetched (1, 2 and 4 measured the same on one core).
constexpr int kPrefetchTiles = 1;

// ---- the register tile: R rows of x against NF weight rows, dot products along K ----

// out[r * NF + f] = sum_k x[r][k] * w_f[k] for the NF rows at w (feature n0 + f at w + f * ldw bytes).
// One decode of each weight vector serves all R rows. Every output has U accumulators (vector i of a step
// into accumulator i % U, each added to in k order, then to each other and summed across lanes by one
// tree). U is the format's (acc_split) on every path, whatever R and NF are, so that a row's result does
// not depend on how many rows share the call or which path serves them (batch invariance: the e2e parity
// tests and in- against out-of-process equality rely on it).
static_assert(kLanes == 8 || kLanes == 16, "the decoders cut blocks into vectors of 8 or 16 weights");
template <class F, int R, int NF, int U>
inline void dot_tile(const QuantArgs& a, const uint8_t* w, int64_t ldw, int64_t n0, const float* x, int64_t ldx,
                     float* out) {
  static_assert(U == 1 || U == 2);
  VF acc[R * NF * U];
  unroll<R * NF * U>([&](auto j) PAGED_FORCE_INLINE { acc[j] = vzero(); });
  const int64_t kn = a.in_features, blocks = kn / F::kBlock;
  typename F::State st[NF];
  // Packed rows are short streams (a row of the embedded model is 324-864 bytes), interleaved NF at a
  // time, which the hardware prefetcher hardly learns before they end: fetch the next tile's rows
  // (the same block of rows n0 + NF ..) while this tile computes.
  const bool next = F::kPrefetch && n0 + (kPrefetchTiles + 1) * NF <= a.out_features;
  const int64_t ahead = next ? kPrefetchTiles * NF * ldw : 0;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* wb = w + blk * F::kBytes;
    if constexpr (F::kPrefetch)
      unroll<NF>([&](auto f) PAGED_FORCE_INLINE {
        for (int o = 0; o < F::kBytes; o += 64) __builtin_prefetch(wb + f * ldw + ahead + o);
      });
    unroll<NF>([&](auto f) PAGED_FORCE_INLINE { F::prepare(wb + f * ldw, a, n0 + f, st[f]); });
    for (int s = 0; s < F::kBlock / F::kStep; ++s) {
      const float* xk = x + blk * F::kBlock + s * F::kStep;
      if constexpr (F::kFeatureOuter) {
        // Feature by feature: its scales live only while its vectors are decoded.
        unroll<NF>([&](auto f) PAGED_FORCE_INLINE {
          const uint8_t* fb = wb + f * ldw;
          const auto sc = F::scales(fb, st[f], s);
          unroll<F::kStep / kLanes>([&](auto i) PAGED_FORCE_INLINE {
            const VF wv = F::template decode<i>(fb, sc, s);
            unroll<R>([&](auto r) PAGED_FORCE_INLINE {
              VF& sum = acc[(r * NF + f) * U + i % U];
              sum = vfma(wv, vload(xk + r * ldx + kLanes * i), sum);
            });
          });
        });
      } else {
        // Vector by vector: NF weight vectors in registers, then each row's activations once.
        unroll<F::kStep / kLanes>([&](auto i) PAGED_FORCE_INLINE {
          VF wv[NF];
          unroll<NF>([&](auto f) PAGED_FORCE_INLINE {
            wv[f] = F::template decode<i>(wb + f * ldw, F::scales(wb + f * ldw, st[f], s), s);
          });
          unroll<R>([&](auto r) PAGED_FORCE_INLINE {
            const VF xv = vload(xk + r * ldx + kLanes * i);
            unroll<NF>([&](auto f) PAGED_FORCE_INLINE {
              VF& sum = acc[(r * NF + f) * U + i % U];
              sum = vfma(wv[f], xv, sum);
            });
          });
        });
      }
    }
  }
  VF sums[R * NF];
  unroll<R * NF>([&](auto j) PAGED_FORCE_INLINE {
    sums[j] = acc[j * U];
    if constexpr (U == 2) sums[j] = vadd(sums[j], acc[j * U + 1]);
  });
  // Horizontal sums four at a time (one transposing reduction), then the rest one by one.
  constexpr int kFours = R * NF / 4;
  unroll<kFours>([&](auto q) PAGED_FORCE_INLINE {
    vsum4(sums[4 * q], sums[4 * q + 1], sums[4 * q + 2], sums[4 * q + 3], out + 4 * q);
  });
  unroll<R * NF - 4 * kFours>([&](auto j) PAGED_FORCE_INLINE { out[4 * kFours + j] = vsum(sums[4 * kFours + j]); });
  if constexpr (F::kTail) {
    for (int64_t k = blocks * F::kBlock; k < kn; ++k)
      for (int f = 0; f < NF; ++f) {
        const float wk = F::weight(w + f * ldw, a, n0 + f, k);
        // One rounding, whatever the compiler would contract in this instantiation (batch invariance).
        for (int r = 0; r < R; ++r) out[r * NF + f] = std::fma(wk, x[r * ldx + k], out[r * NF + f]);
      }
  }
}

// Rows r0 .. r0 + R, features n0 .. n0 + nf of the output from the sums v[R][NF] (+ bias), rounded once.
template <Elem E, int R, int NF>
inline void store_tile_as(const QuantArgs& a, const float* v, int nf, int64_t r0, int64_t n0) {
  Store<E>* out = static_cast<Store<E>*>(a.out) + r0 * a.out_features + n0;
  for (int r = 0; r < R; ++r)
    for (int f = 0; f < nf; ++f)
      out[r * a.out_features + f] = round_to<E>(v[r * NF + f] + (a.bias != nullptr ? a.bias[n0 + f] : 0.0f));
}

template <int R, int NF>
inline void store_tile(const QuantArgs& a, const float* v, int nf, int64_t r0, int64_t n0) {
  switch (a.out_type) {
    case Elem::F32: store_tile_as<Elem::F32, R, NF>(a, v, nf, r0, n0); break;
    case Elem::BF16: store_tile_as<Elem::BF16, R, NF>(a, v, nf, r0, n0); break;
    case Elem::F16: store_tile_as<Elem::F16, R, NF>(a, v, nf, r0, n0); break;
  }
}

// A tile of R rows and nf <= NF features into v[R * NF] (nf known at run time only at the end of a range):
// dot(Int<C>(), out) computes C features into out[R * C]; returns the features computed.
template <int R, int NF, typename Dot>
inline int partial_tile(int nf, float* v, const Dot& dot) {
  if (nf >= NF) {
    dot(Int<NF>(), v);
    return NF;
  }
  unroll<NF - 1>([&](auto c) PAGED_FORCE_INLINE {
    constexpr int C = decltype(c)::value + 1;
    if (nf != C) return;
    float t[R * C];
    dot(Int<C>(), t);
    for (int r = 0; r < R; ++r)
      for (int f = 0; f < C; ++f) v[r * NF + f] = t[r * C + f];
  });
  return nf;
}

template <class F, int R, int NF, int U>
inline void tile_any(const QuantArgs& a, const uint8_t* w, int64_t ldw, int nf, int64_t n0, int64_t r0) {
  float v[R * NF];
  const float* x = a.x + r0 * a.ldx;
  nf = partial_tile<R, NF>(nf, v, [&](auto cols, float* out) {
    dot_tile<F, R, decltype(cols)::value, U>(a, w, ldw, n0, x, a.ldx, out);
  });
  store_tile<R, NF>(a, v, nf, r0, n0);
}

// Output features per tile for R rows: 4 to 12 accumulators (one row: 4 FMA chains; against 8 from split
// sums the AVX2 build's one-row time moved within the machine's noise, decoding being what limits it).
// q8_0's width is one (one sequential stream through its rows, as in quant_q8_body.h: its decoding is cheap
// enough for the interleaved rows' memory streams to be what limits it), so it splits each output's sum in
// two (kAccSplit) for the chains of one row, on every path.
template <class F>
constexpr int format_width() {
  if constexpr (requires { F::kWidth; }) return F::kWidth;
  else return 4;
}
template <class F>
constexpr int acc_split() {
  if constexpr (requires { F::kAccSplit; }) return F::kAccSplit;
  else return 1;
}
template <class F, int R>
constexpr int stream_width() {
  constexpr int fit = R <= 3 ? 4 : 3;
  return format_width<F>() < fit ? format_width<F>() : fit;
}
constexpr int kStreamRows = 4;

// The rows of x cut into tiles of at most kMax, as even as possible; fn(Int<rows>, first row).
template <int kMax, typename Fn>
inline void for_row_tiles(int64_t m, const Fn& fn) {
  const int64_t tiles = (m + kMax - 1) / kMax;
  int64_t r0 = 0;
  for (int64_t i = 0; i < tiles; ++i) {
    const int rows = static_cast<int>((m - r0) / (tiles - i) + ((m - r0) % (tiles - i) != 0));
    unroll<kMax>([&](auto c) PAGED_FORCE_INLINE {
      if (rows == decltype(c)::value + 1) fn(Int<decltype(c)::value + 1>(), r0);
    });
    r0 += rows;
  }
}
template <typename Fn>
inline void for_stream_row_tiles(int64_t m, const Fn& fn) {
  for_row_tiles<kStreamRows>(m, fn);
}

// Streaming: for each group of kQuantGroup features (whose packed rows then stay in L1), every row tile
// of x against them, the weights dequantized in registers.
template <class F>
void stream_rows(const QuantArgs& a, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; g += kQuantGroup) {
    const int64_t ge = g + kQuantGroup < end ? g + kQuantGroup : end;
    for_stream_row_tiles(a.rows, [&](auto rows, int64_t r0) {
      constexpr int R = decltype(rows)::value, NF = stream_width<F, R>();
      for (int64_t n0 = g; n0 < ge; n0 += NF)
        tile_any<F, R, NF, acc_split<F>()>(a, a.w + n0 * a.ldw, a.ldw, static_cast<int>(ge - n0), n0, r0);
    });
  }
}

// One packed row dequantized into fp32 dst[K].
template <class F>
inline void dequant_row(const QuantArgs& a, int64_t n, float* dst) {
  const uint8_t* row = a.w + n * a.ldw;
  const int64_t kn = a.in_features, blocks = kn / F::kBlock;
  typename F::State st;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* wb = row + blk * F::kBytes;
    F::prepare(wb, a, n, st);
    for (int s = 0; s < F::kBlock / F::kStep; ++s) {
      float* d = dst + blk * F::kBlock + s * F::kStep;
      const auto sc = F::scales(wb, st, s);
      unroll<F::kStep / kLanes>([&](auto i) PAGED_FORCE_INLINE {
        vstore(d + kLanes * i, F::template decode<i>(wb, sc, s));
      });
    }
  }
  if constexpr (F::kTail)
    for (int64_t k = blocks * F::kBlock; k < kn; ++k) dst[k] = F::weight(row, a, n, k);
}

// The dequantize path's tile: 4 rows x 3 features, 12 accumulators + 3 weight vectors + 1 activation
// (4 x 2, 6 x 2 and 5 x 2 measured slower on one core, 3 x 3 about the same); a format that splits its
// sums (acc_split) keeps its split here too: in 4 x 1 tiles (8 accumulators) with 16 vector registers, in
// 4 x 3 tiles (24) with 32 (kVecRegs, the including build's; the tile's shape never changes an output's
// order, so both give the same bits).
constexpr int kDotRows = 4;
template <class F>
constexpr int dot_width() {
  return acc_split<F>() == 1 || kVecRegs >= 32 ? 3 : 1;
}

// Dequantize path: a.chunk features at a time into an fp32 scratch (kept in L2), then every tile of
// 4 rows of x (kept in L1) against it.
template <class F>
void dequant_dot(const QuantArgs& a, int64_t begin, int64_t end) {
  const int64_t kn = a.in_features, chunk = a.chunk;
  const size_t bytes = static_cast<size_t>(chunk * kn) * sizeof(float);
  float* scratch = static_cast<float*>(::operator new[](bytes, std::align_val_t(64)));
  struct Free {
    float* p;
    ~Free() { ::operator delete[](p, std::align_val_t(64)); }
  } owner{scratch};
  const int64_t ldw = kn * static_cast<int64_t>(sizeof(float));
  for (int64_t c = begin; c < end; c += chunk) {
    const int64_t ce = c + chunk < end ? c + chunk : end;
    for (int64_t n = c; n < ce; ++n) dequant_row<F>(a, n, scratch + (n - c) * kn);
    // Feature n0 is scratch row n0 - c.
    auto rows_at = [&](int64_t n0) { return reinterpret_cast<const uint8_t*>(scratch + (n0 - c) * kn); };
    int64_t r0 = 0;
    constexpr int NF = dot_width<F>(), U = acc_split<F>();
    for (; r0 + kDotRows <= a.rows; r0 += kDotRows)
      for (int64_t n0 = c; n0 < ce; n0 += NF)
        tile_any<FmtF32, kDotRows, NF, U>(a, rows_at(n0), ldw, static_cast<int>(ce - n0), n0, r0);
    if (r0 < a.rows) {
      auto rest = [&](auto rows) {
        for (int64_t n0 = c; n0 < ce; n0 += NF)
          tile_any<FmtF32, decltype(rows)::value, NF, U>(a, rows_at(n0), ldw, static_cast<int>(ce - n0), n0, r0);
      };
      switch (a.rows - r0) {  // fewer than kDotRows (at most 7)
        case 1: rest(Int<1>()); break;
        case 2: rest(Int<2>()); break;
        case 3: if constexpr (kDotRows > 3) rest(Int<3>()); break;
        case 4: if constexpr (kDotRows > 4) rest(Int<4>()); break;
        case 5: if constexpr (kDotRows > 5) rest(Int<5>()); break;
        case 6: if constexpr (kDotRows > 6) rest(Int<6>()); break;
        default: if constexpr (kDotRows > 7) rest(Int<7>()); break;
      }
    }
  }
}

template <template <class> class Body>
inline void by_format(const QuantArgs& a, int64_t begin, int64_t end) {
  switch (a.format) {
    case QFormat::Q4_0: Body<FmtQ4_0>::run(a, begin, end); break;
    case QFormat::Q4_1: Body<FmtQ4_1>::run(a, begin, end); break;
    case QFormat::Q8_0: Body<FmtQ8_0>::run(a, begin, end); break;
    case QFormat::Q4_K: Body<FmtQ4_K>::run(a, begin, end); break;
    case QFormat::Q6_K: Body<FmtQ6_K>::run(a, begin, end); break;
    case QFormat::INT8: Body<FmtInt8>::run(a, begin, end); break;
  }
}

template <class F>
struct StreamBody {
  static void run(const QuantArgs& a, int64_t b, int64_t e) { stream_rows<F>(a, b, e); }
};
template <class F>
struct DequantBody {
  static void run(const QuantArgs& a, int64_t b, int64_t e) { dequant_dot<F>(a, b, e); }
};

inline void quant_stream(const QuantArgs& a, int64_t begin, int64_t end) { by_format<StreamBody>(a, begin, end); }
inline void quant_dequant_dot(const QuantArgs& a, int64_t begin, int64_t end) {
  by_format<DequantBody>(a, begin, end);
}
