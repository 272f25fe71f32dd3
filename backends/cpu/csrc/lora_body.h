// The multi-LoRA row kernels (lora_api.h) as loops over tokens, one token at a time.
//
// Included inside a per-ISA namespace after fused_body.h (Store, load, round_to, to_float, Scratch) and after
// the includer's `template <Elem W> float dot(const float* x, const Store<W>* w, int64_t n)` (the fp32 dot product
// of an fp32 row with n weights of type W, widened in registers) and `template <Elem W> void dots(const float* x,
// const Store<W>* w, int64_t n, int64_t count, float* out)` (out[j] = dot(x, w + j * n, n) for j < count: expand's
// many short dot products, where the AVX2 build reduces eight at a time).

inline int64_t elem_bytes(Elem e) { return e == Elem::F32 ? 4 : 2; }

template <Elem W>
void shrink_tokens(const LoraShrinkArgs& a, int64_t begin, int64_t end) {
  const int64_t rank = a.rank, k = a.in_features;
  const auto* base = static_cast<const Store<W>*>(a.a);
  const auto* x = static_cast<const char*>(a.x);
  Scratch row(k);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t t = a.tokens[i];
    const Store<W>* w = base + a.slots[t] * rank * k;
    to_float(x + t * a.ldx * elem_bytes(a.x_type), a.x_type, k, row.data());
    float* out = a.out + t * rank;
    for (int64_t r = 0; r < rank; ++r) out[r] = dot<W>(row.data(), w + r * k, k);
  }
}

template <Elem W, Elem Y>
void expand_tokens(const LoraExpandArgs& a, int64_t begin, int64_t end) {
  const int64_t rank = a.rank, n = a.out_features;
  const auto* base = static_cast<const Store<W>*>(a.b);
  Scratch delta(n);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t t = a.tokens[i];
    dots<W>(a.shrunk + t * a.lds, base + a.slots[t] * n * rank, rank, n, delta.data());
    Store<Y>* y = static_cast<Store<Y>*>(a.y) + t * a.ldy;
    for (int64_t j = 0; j < n; ++j) y[j] = round_to<Y>(load<Y>(y, j) + delta.data()[j]);
  }
}

template <Elem W>
void expand_w(const LoraExpandArgs& a, int64_t begin, int64_t end) {
  switch (a.y_type) {
    case Elem::F32: expand_tokens<W, Elem::F32>(a, begin, end); break;
    case Elem::BF16: expand_tokens<W, Elem::BF16>(a, begin, end); break;
    case Elem::F16: expand_tokens<W, Elem::F16>(a, begin, end); break;
  }
}

void shrink(const LoraShrinkArgs& a, int64_t begin, int64_t end) {
  switch (a.a_type) {
    case Elem::F32: shrink_tokens<Elem::F32>(a, begin, end); break;
    case Elem::BF16: shrink_tokens<Elem::BF16>(a, begin, end); break;
    case Elem::F16: shrink_tokens<Elem::F16>(a, begin, end); break;
  }
}

void expand(const LoraExpandArgs& a, int64_t begin, int64_t end) {
  switch (a.b_type) {
    case Elem::F32: expand_w<Elem::F32>(a, begin, end); break;
    case Elem::BF16: expand_w<Elem::BF16>(a, begin, end); break;
    case Elem::F16: expand_w<Elem::F16>(a, begin, end); break;
  }
}
