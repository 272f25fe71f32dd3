// Linear products over packed q4_0 and q4_1 weights with int8 activations, as one portable algorithm.
//
// Included inside a per-ISA namespace (quant_scalar.cpp, quant_avx2.cpp and its VNNI build) after the
// 8-lane primitives of quant_body.h (VF, VI, vzero, vset1, vfma, vcvt, vsum, vsum4, f16_at) and these:
//   VB: 32 bytes; vbytes(p): the 32 bytes at p; vnib(p): the 16 bytes at p as 32 nibbles, low nibbles
//   first (weights 0-15 of a 4-bit block, then 16-31); vdot(u, s) -> VI: 8 sums of 4 products of
//   unsigned bytes u and signed bytes s;
//   vf16_words<N>(p, ld): the two fp16 of the 4 bytes at p + f * ld, f < N <= 4, as fp32 lanes 2f, 2f + 1
//   (the rest 0); vf16_halves<N>(p, ld): the fp16 at p + f * ld, f < N <= 4, as lane f; vpair(p): the two
//   floats at p in every pair of lanes; vround(v): each lane rounded to the nearest integer, ties to even.
//
// Why: at one to a few rows the products are bound by decoding weights, not by memory. An fp32 lane holds
// one weight, a byte lane four, so multiplying the small integers of the blocks by 8-bit activations in
// integer dot products decodes and multiplies four times the weights per instruction (llama.cpp's and
// vLLM's GGUF kernels do the same). The activations are rounded first, once per call (round_q8_rows):
// each 32-wide block of a row to q = round(x / d), |q| <= 127, d = max|x| / 127, exactly as
// paged_core.quant.round_activations_q8 does, so the result is the exact product with those rounded
// activations up to the order of the fp32 sums (the contract's q8_activation_formats, and the
// conformance suite's second oracle).
//
// A weight block is d * q (+ m): its dot product with an activation block (da, qa) is
// d * da * sum(q * qa) + m * (da * sum(qa)); the integer sum is exact, and the last factor is per
// activation block (round_q8_rows stores da and da * sum(qa) side by side). q4_0 is d * q - 8d, so
// m = -8d. q8_0 is not rounded here: with 8-bit weights the activations' rounding is the larger error,
// and a GGUF's q8_0 tensor is often the tied LM head, where it decides tokens directly (the embedded
// model's "What is the capital of France?" answered "L'Étoile" instead of "Paris" with it); q8_0 streams
// exactly in quant_body.h, one weight row at a time.
// The scales of a tile's NF weight rows are converted together, one vector per block (their fp16s
// gathered, one conversion, one product with the activation scales), not one by one: per weight
// block the integer dot product is a handful of instructions, and scalar scale arithmetic was as many.

// kWidth: weight rows a tile interleaves at one row of x (four share each activation load and each scale
// conversion; fewer measured no faster for the 4-bit formats, which cost more arithmetic per byte).
struct Q8Q4_0 {  // f16 d, 16 bytes of nibbles
  static constexpr int kBytes = 18, kWidth = 4;
  static constexpr bool kPairs = false;  // m = -8d, from d's vector
  PAGED_FORCE_INLINE static VB quants(const uint8_t* b) { return vnib(b + 2); }
};

struct Q8Q4_1 {  // f16 d, f16 m, 16 bytes of nibbles
  static constexpr int kBytes = 20, kWidth = 4;
  static constexpr bool kPairs = true;  // (d, m) converted as pairs
  PAGED_FORCE_INLINE static VB quants(const uint8_t* b) { return vnib(b + 4); }
};

// out[r * NF + f] = the R rows of x (rounded: a.xq) against the NF packed rows at w, n0 the first feature.
template <class F, int R, int NF>
inline void q8_dot_tile(const QuantArgs& a, const uint8_t* w, int64_t n0, int64_t r0, float* out) {
  static_assert(NF <= 4, "vf16_words converts the scale pairs of at most 4 rows");
  const int64_t blocks = a.in_features / 32, ldw = a.ldw;
  const int8_t* xq = a.xq + r0 * a.in_features;
  const float* xds = a.xds + 2 * r0 * blocks;  // (d, d * sum(q)) per row and block
  VF acc[R * NF];
  VF mins[R];  // kPairs: m * (da * sum(qa)) in lanes 2f + 1; q4_0: d * (-8 da sum(qa)) in lane f
  unroll<R * NF>([&](auto j) PAGED_FORCE_INLINE { acc[j] = vzero(); });
  unroll<R>([&](auto r) PAGED_FORCE_INLINE { mins[r] = vzero(); });
  // As quant_body.h's streaming tile: fetch the next tile's rows while this one computes.
  const bool next = n0 + (kPrefetchTiles + 1) * NF <= a.out_features;
  const int64_t ahead = next ? kPrefetchTiles * NF * ldw : 0;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* wb = w + blk * F::kBytes;
    const VF ws = F::kPairs ? vf16_words<NF>(wb, ldw) : vf16_halves<NF>(wb, ldw);
    float scale[R][kLanes];  // d * da of feature f at lane f (kPairs: 2f)
    VB xa[R];
    unroll<R>([&](auto r) PAGED_FORCE_INLINE {
      const float* ds = xds + 2 * (r * blocks + blk);
      xa[r] = vbytes(reinterpret_cast<const uint8_t*>(xq + r * a.in_features + 32 * blk));
      if constexpr (F::kPairs) {
        const VF p = vmul(ws, vpair(ds));
        mins[r] = vadd(mins[r], p);
        vstore(scale[r], p);
      } else {
        vstore(scale[r], vmul(ws, vset1(ds[0])));
        mins[r] = vfma(ws, vset1(-8.0f * ds[1]), mins[r]);
      }
    });
    unroll<NF>([&](auto f) PAGED_FORCE_INLINE {
      const uint8_t* fb = wb + f * ldw;
      __builtin_prefetch(fb + ahead);
      const VB u = F::quants(fb);
      unroll<R>([&](auto r) PAGED_FORCE_INLINE {
        const VI dot = vdot(u, xa[r]);
        acc[r * NF + f] = vfma(vcvt(dot), vset1(scale[r][F::kPairs ? 2 * f : f]), acc[r * NF + f]);
      });
    });
  }
  constexpr int kFours = R * NF / 4;
  unroll<kFours>([&](auto q) PAGED_FORCE_INLINE { vsum4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3], out + 4 * q); });
  unroll<R * NF - 4 * kFours>([&](auto j) PAGED_FORCE_INLINE { out[4 * kFours + j] = vsum(acc[4 * kFours + j]); });
  unroll<R>([&](auto r) PAGED_FORCE_INLINE {
    float m[kLanes];
    vstore(m, mins[r]);
    for (int f = 0; f < NF; ++f) out[r * NF + f] += m[F::kPairs ? 2 * f + 1 : f];
  });
}

// Features per tile for R rows: R * NF accumulators + R activation blocks + 2 weight registers fit in 16;
// at most the format's kWidth.
template <class F, int R>
constexpr int q8_width() {
  constexpr int fit = R <= 2 ? 4 : R == 3 ? 3 : 2;
  return F::kWidth < fit ? F::kWidth : fit;
}

// The tile of R rows and nf <= NF features (fewer only at the end of a range).
template <class F, int R, int NF>
inline void q8_tile_any(const QuantArgs& a, int nf, int64_t n0, int64_t r0) {
  float v[R * NF];
  const uint8_t* w = a.w + n0 * a.ldw;
  nf = partial_tile<R, NF>(nf, v, [&](auto cols, float* out) {
    q8_dot_tile<F, R, decltype(cols)::value>(a, w, n0, r0, out);
  });
  store_tile<R, NF>(a, v, nf, r0, n0);
}

template <class F>
void q8_stream_rows(const QuantArgs& a, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; g += kQuantGroup) {
    const int64_t ge = g + kQuantGroup < end ? g + kQuantGroup : end;
    for_stream_row_tiles(a.rows, [&](auto rows, int64_t r0) {
      constexpr int R = decltype(rows)::value, NF = q8_width<F, R>();
      for (int64_t n0 = g; n0 < ge; n0 += NF) q8_tile_any<F, R, NF>(a, static_cast<int>(ge - n0), n0, r0);
    });
  }
}

// The rows of x rounded for the q8 path (Q8RoundFn), per 32-wide block: d = max|x| / 127, q = round(x * (1 / d))
// to nearest, ties to even (vround: one vroundps on x86; nearbyint in the default rounding mode in the
// portable build), in fp32, exactly as paged_core.quant.round_activations_q8. Plain loops that the build's target
// vectorises: the max over |x| as unsigned bit patterns (ordered as the values are, for non-negative
// floats), so no NaN rule keeps it scalar. A block with an inf or NaN gets q = 0 and d = that value, so
// the products it enters are NaN, as the reference's would be.
inline void round_q8_rows(const float* x, int64_t ldx, int64_t rows, int64_t k, int8_t* xq, float* xds) {
  const int64_t blocks = k / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * ldx + 32 * b;
      int8_t* q = xq + r * k + 32 * b;
      uint32_t bits[32], top = 0;
      std::memcpy(bits, xb, sizeof(bits));
      for (int j = 0; j < 32; ++j) {
        const uint32_t u = bits[j] & 0x7fffffffu;
        top = top > u ? top : u;
      }
      float amax;
      std::memcpy(&amax, &top, 4);
      if (!(amax <= 3.4028234663852886e38f)) {  // inf or NaN
        std::memset(q, 0, 32);
        xds[2 * (r * blocks + b)] = amax;
        xds[2 * (r * blocks + b) + 1] = 0.0f;
        continue;
      }
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      float v[32];
      unroll<32 / kLanes>([&](auto i) PAGED_FORCE_INLINE {  // |v| <= 127: |x| <= amax
        vstore(v + kLanes * i, vround(vmul(vload(xb + kLanes * i), vset1(id))));
      });
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int32_t qi = static_cast<int32_t>(v[j]);
        q[j] = static_cast<int8_t>(qi);
        sum += qi;
      }
      xds[2 * (r * blocks + b)] = d;
      xds[2 * (r * blocks + b) + 1] = d * static_cast<float>(sum);
    }
}

// Output features [begin, end) of every row, for q4_0 and q4_1; a.xq and a.xds set by round_q8_rows.
inline void quant_stream_q8(const QuantArgs& a, int64_t begin, int64_t end) {
  switch (a.format) {
    case QFormat::Q4_0: q8_stream_rows<Q8Q4_0>(a, begin, end); break;
    case QFormat::Q4_1: q8_stream_rows<Q8Q4_1>(a, begin, end); break;
    default: break;  // never called for other formats (fused_ops.cpp: q8_format)
  }
}
