// The int8-activation path (quant_q8_body.h) over q4_0 / q4_1 weights repacked in groups of 8 rows, so that
// the 8 lanes of a vector are 8 output features: no scale gathers and no horizontal sums.
//
// Included after quant_q8_body.h inside the AVX2 and VNNI namespaces of quant_avx2.cpp, which define
//   vdot_acc(acc, u, s) -> VI: acc + the 8 sums of 4 products of unsigned bytes u and signed bytes s.
//
// Layout (made at load by paged_backend_cpu.fused.interleave_q4): per group of 8 weight rows and per block
// of 32 weights, the 8 rows' fp16 d (q4_1: then their 8 fp16 m), then 4 vectors of 32 bytes: vector g holds,
// for row j, the 4 bytes 4g .. 4g + 3 of that row's block (low nibbles: weights 4g + t, high nibbles:
// weights 16 + 4g + t). A vector's low nibbles against activation bytes 4g .. 4g + 3 broadcast to every
// lane, its high nibbles against bytes 16 + 4g .., give lane j row j's partial dot product.
//
// Why: one row of x against GGUF rows decodes one weight row per vector and gathers each row's scale
// (quant_q8_body.h); measured standalone on one Zen 4 core with the weights in cache (576 x 1536 q4_1),
// 33 us for that against 10 us for this layout, which is then bound by memory.

// Features n0 .. n0 + 8 of R rows of x (rounded: a.xq, a.xds) into out[r * 8 + f]; w is the group's first byte.
// One group at a time: its bytes are one sequential stream (two groups interleaved measured slower at one row,
// as interleaved rows did for q8_0 in quant_body.h). A row's integer products go into C chains per nibble half
// (one row: two, so that enough dot products are in flight; many rows: one, so that the accumulators of kX8Rows
// rows fit the registers); the integer sums are exact, so C never changes a bit of the result.
//
// The rule every row count follows (batch invariance): per output and block b in order,
//   acc = fma(float(isum_b), d_b * da_b, acc);  acc = fma(m_b, da_b * sum(qa_b), acc)
// with isum_b the exact integer dot product of the block's nibbles and int8 activations, d_b * da_b one fp32
// product, and acc starting at 0: a row's bits depend on its own activations only, not on R or the tile.
template <bool kMin, int R>
inline void x8_tile(const QuantArgs& a, const uint8_t* w, int64_t r0, float* out) {
  constexpr int kScaleBytes = x8_scale_bytes(kMin), kBlockBytes = x8_block_bytes(kMin);
  constexpr int C = R == 1 ? 2 : 1;      // chains per row and nibble half
  constexpr bool kHalves = R <= 4;       // low and high nibbles in chains of their own
  const int64_t blocks = a.in_features / 32;
  const __m256i low = _mm256_set1_epi8(15);
  VF acc[R];
  unroll<R>([&](auto r) PAGED_FORCE_INLINE { acc[r] = vzero(); });
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* b = w + blk * kBlockBytes;
    for (int o = 0; o < kBlockBytes; o += 64) __builtin_prefetch(b + 4 * kBlockBytes + o);
    VI lo[R * C], hi[kHalves ? R * C : 1];
    unroll<R * C>([&](auto j) PAGED_FORCE_INLINE {
      lo[j] = _mm256_setzero_si256();
      if constexpr (kHalves) hi[j] = _mm256_setzero_si256();
    });
    unroll<4>([&](auto v) PAGED_FORCE_INLINE {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kScaleBytes + 32 * v));
      const __m256i ql = _mm256_and_si256(q, low), qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      unroll<R>([&](auto r) PAGED_FORCE_INLINE {
        const int32_t* xa = reinterpret_cast<const int32_t*>(a.xq + (r0 + r) * a.in_features + 32 * blk);
        constexpr int j = decltype(r)::value * C + decltype(v)::value % C;
        lo[j] = vdot_acc(lo[j], ql, _mm256_set1_epi32(xa[v]));
        if constexpr (kHalves) hi[j] = vdot_acc(hi[j], qh, _mm256_set1_epi32(xa[4 + v]));
        else lo[j] = vdot_acc(lo[j], qh, _mm256_set1_epi32(xa[4 + v]));
      });
    });
    const VF d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    const VF m = kMin ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)))
                      : vmul(d, vset1(-8.0f));  // q4_0: d * q - 8d
    unroll<R>([&](auto r) PAGED_FORCE_INLINE {
      constexpr int j = decltype(r)::value * C;
      const float* ds = a.xds + 2 * ((r0 + r) * blocks + blk);  // (da, da * sum(qa))
      VI sum = lo[j];
      if constexpr (kHalves) sum = _mm256_add_epi32(sum, hi[j]);
      if constexpr (C == 2) sum = _mm256_add_epi32(sum, _mm256_add_epi32(lo[j + 1], hi[j + 1]));
      acc[r] = vfma(vcvt(sum), vmul(d, vset1(ds[0])), acc[r]);
      acc[r] = vfma(m, vset1(ds[1]), acc[r]);
    });
  }
  unroll<R>([&](auto r) PAGED_FORCE_INLINE { vstore(out + 8 * r, acc[r]); });
}

// Rows per tile: at most kX8Rows (the including build's: as many as its registers hold); many rows in blocks.
constexpr int64_t kX8RowBlock = 128;

// Output features [begin, end) (multiples of 8) of every row, from the interleaved copy a.w (a.ldw unused).
// Few rows (decode): each row tile streams every group once. Many rows: the groups of a slice of kX8Slice
// features stay in L1 while every row tile passes over them.
template <bool kMin>
void x8_stream(const QuantArgs& a, int64_t begin, int64_t end) {
  const int64_t group_bytes = a.in_features / 32 * x8_block_bytes(kMin);
  const int64_t slice = a.rows <= kX8Rows ? end - begin : std::max<int64_t>(8, kX8SliceBytes / group_bytes * 8);
  // Many rows also go in blocks of kX8RowBlock (outside the slices), for the reasons of quant_amx.cpp.
  for (int64_t rb = 0; rb < a.rows; rb += kX8RowBlock)
  for (int64_t s0 = begin; s0 < end; s0 += slice) {
    const int64_t s1 = std::min(end, s0 + slice);
    for_row_tiles<kX8Rows>(std::min<int64_t>(kX8RowBlock, a.rows - rb), [&](auto rows, int64_t r) {
      const int64_t r0 = rb + r;
      constexpr int R = decltype(rows)::value;
      for (int64_t n0 = s0; n0 < s1; n0 += 8) {
        float v[R * 8];
        x8_tile<kMin, R>(a, a.w + n0 / 8 * group_bytes, r0, v);
        store_tile<R, 8>(a, v, 8, r0, n0);
      }
    });
  }
}

inline void quant_stream_x8(const QuantArgs& a, int64_t begin, int64_t end) {
  if (a.format == QFormat::Q4_1) x8_stream<true>(a, begin, end);
  else x8_stream<false>(a, begin, end);
}
