// paged_cpu::apply_token_bitmask: structured outputs' mask, in place on the step's logits.
// Word w of a bitmask row allows tokens 32w..32w+31 (bit t % 32 set = allowed). Grammars mostly allow nothing or
// everything in a word, so whole words take a fast path (32 stores of -inf, or nothing) and only mixed words are
// read bit by bit. One thread: a 32-row mask over a 49k vocabulary is ~1.5M stores, less than a parallel region's
// wake-up on a loaded machine.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <limits>

#include "ops.h"

namespace paged_cpu {
namespace {

template <typename T>
void mask_row(T* row, const int32_t* words, int64_t num_words, int64_t vocab) {
  const T ninf = static_cast<T>(-std::numeric_limits<float>::infinity());
  const int64_t covered = std::min(vocab, num_words * 32);
  int64_t t = 0;
  for (int64_t w = 0; w < num_words && t < covered; ++w, t += 32) {
    const uint32_t bits = static_cast<uint32_t>(words[w]);
    const int64_t n = std::min<int64_t>(32, covered - t);
    if (bits == 0xFFFFFFFFu) continue;
    if (bits == 0) {
      for (int64_t i = 0; i < n; ++i) row[t + i] = ninf;
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!((bits >> i) & 1u)) row[t + i] = ninf;
    }
  }
  for (int64_t c = covered; c < vocab; ++c) row[c] = ninf;  // columns past the mask: never allowed
}

template <typename T>
void mask_rows(const at::Tensor& logits, const at::Tensor& bitmask, const int64_t* rows, int64_t n) {
  auto* base = logits.data_ptr<T>();
  const auto* words = bitmask.data_ptr<int32_t>();
  const int64_t vocab = logits.size(1), stride = logits.stride(0), num_words = bitmask.size(1);
  for (int64_t i = 0; i < n; ++i) mask_row(base + rows[i] * stride, words + i * num_words, num_words, vocab);
}

}  // namespace

void apply_token_bitmask(const at::Tensor& logits, const at::Tensor& bitmask, const at::Tensor& rows) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "paged_cpu::apply_token_bitmask: logits must be a "
              "[batch, vocab] tensor with unit stride along the vocabulary, got sizes ", logits.sizes(),
              " strides ", logits.strides());
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.is_contiguous(),
              "paged_cpu::apply_token_bitmask: bitmask must be a contiguous int32 [rows, words], got ",
              bitmask.scalar_type(), " ", bitmask.sizes());
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous(),
              "paged_cpu::apply_token_bitmask: rows must be a contiguous int64 vector");
  const int64_t n = rows.size(0);
  TORCH_CHECK(bitmask.size(0) == n, "paged_cpu::apply_token_bitmask: ", n, " rows but the bitmask has ",
              bitmask.size(0));
  const auto* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(r[i] >= 0 && r[i] < logits.size(0), "paged_cpu::apply_token_bitmask: row ", r[i],
                " is outside the logits' ", logits.size(0), " rows");
  }
  switch (logits.scalar_type()) {
    case at::kFloat: mask_rows<float>(logits, bitmask, r, n); break;
    case at::kBFloat16: mask_rows<c10::BFloat16>(logits, bitmask, r, n); break;
    case at::kHalf: mask_rows<c10::Half>(logits, bitmask, r, n); break;
    default: TORCH_CHECK(false, "paged_cpu::apply_token_bitmask: logits of ", logits.scalar_type(),
                         " are not supported (float32, bfloat16, float16)");
  }
}

}  // namespace paged_cpu
