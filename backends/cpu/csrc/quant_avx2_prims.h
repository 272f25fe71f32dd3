// The AVX2 + FMA + F16C primitives of quant_body.h and quant_q8_body.h (8-lane ymm vectors), included in
// quant_avx2.cpp by its AVX2 build and its AVX-512 VNNI build of the q8 path, each under its own target.

constexpr int kLanes = 8;

using VF = __m256;
using VI = __m256i;

PAGED_FORCE_INLINE inline VF vzero() { return _mm256_setzero_ps(); }
PAGED_FORCE_INLINE inline VF vset1(float s) { return _mm256_set1_ps(s); }
PAGED_FORCE_INLINE inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
PAGED_FORCE_INLINE inline void vstore(float* p, VF a) { _mm256_storeu_ps(p, a); }
PAGED_FORCE_INLINE inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
PAGED_FORCE_INLINE inline VF vmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
PAGED_FORCE_INLINE inline VF vadd(VF a, VF b) { return _mm256_add_ps(a, b); }
// vsum and vsum4 add the lanes by one tree, ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), so an output
// summed by either has the same bits (batch invariance, quant_body.h).
PAGED_FORCE_INLINE inline float vsum(VF a) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, a), _mm256_hadd_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}
PAGED_FORCE_INLINE inline void vsum4(VF a, VF b, VF c, VF d, float* out) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));  // per half: a, b, c, d
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}
PAGED_FORCE_INLINE inline VI vu8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
PAGED_FORCE_INLINE inline VI vi8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
PAGED_FORCE_INLINE inline VI vand(VI a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
PAGED_FORCE_INLINE inline VI vsrl(VI a, int n) { return _mm256_srli_epi32(a, n); }
PAGED_FORCE_INLINE inline VI vsll(VI a, int n) { return _mm256_slli_epi32(a, n); }
PAGED_FORCE_INLINE inline VI vor(VI a, VI b) { return _mm256_or_si256(a, b); }
PAGED_FORCE_INLINE inline VI vsubi(VI a, int s) { return _mm256_sub_epi32(a, _mm256_set1_epi32(s)); }
PAGED_FORCE_INLINE inline VF vcvt(VI a) { return _mm256_cvtepi32_ps(a); }
PAGED_FORCE_INLINE inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

PAGED_FORCE_INLINE inline VF vset1_f16(const uint8_t* p) {
  int16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

// Bytes (quant_q8_body.h).
using VB = __m256i;
PAGED_FORCE_INLINE inline VB vbytes(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
PAGED_FORCE_INLINE inline VB vnib(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f));
}

// Scales of up to 4 weight rows at once (quant_q8_body.h): inserted at constant lanes, one conversion.
template <int N>
PAGED_FORCE_INLINE inline VF vf16_words(const uint8_t* p, int64_t ld) {
  static_assert(N >= 1 && N <= 4, "four 32-bit words fill the 8 fp16 lanes");
  auto word = [&](int f) PAGED_FORCE_INLINE { int32_t w; std::memcpy(&w, p + f * ld, 4); return w; };
  __m128i v = _mm_cvtsi32_si128(word(0));
  if constexpr (N > 1) v = _mm_insert_epi32(v, word(1), 1);
  if constexpr (N > 2) v = _mm_insert_epi32(v, word(2), 2);
  if constexpr (N > 3) v = _mm_insert_epi32(v, word(3), 3);
  return _mm256_cvtph_ps(v);
}
template <int N>
PAGED_FORCE_INLINE inline VF vf16_halves(const uint8_t* p, int64_t ld) {
  static_assert(N >= 1 && N <= 4, "used for tiles of at most 4 rows");
  auto half = [&](int f) PAGED_FORCE_INLINE { uint16_t h; std::memcpy(&h, p + f * ld, 2); return static_cast<int>(h); };
  __m128i v = _mm_cvtsi32_si128(half(0));
  if constexpr (N > 1) v = _mm_insert_epi16(v, half(1), 1);
  if constexpr (N > 2) v = _mm_insert_epi16(v, half(2), 2);
  if constexpr (N > 3) v = _mm_insert_epi16(v, half(3), 3);
  return _mm256_cvtph_ps(v);
}
PAGED_FORCE_INLINE inline VF vpair(const float* p) {
  double pair;
  std::memcpy(&pair, p, 8);
  return _mm256_castpd_ps(_mm256_set1_pd(pair));
}
PAGED_FORCE_INLINE inline VF vround(VF v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
