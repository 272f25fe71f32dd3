// paged_cpu::lora_shrink / lora_expand: the multi-LoRA products of every token with its own adapter.
//
// Tokens are grouped without sorting: an engine's batch holds each request's tokens together, so adapters come in
// runs of consecutive tokens. A run of at least 16 tokens (expand: 8) is one GEMM (torch's: MKL or oneDNN) on its
// row range, read in place; the remaining tokens of a slot (short runs: decode rows mixing adapters) are gathered
// into one GEMM when there are as many of them, else go through the row kernels (lora_body.h), which read the
// adapter's weights in their own dtype. Every product sums in fp32; expand rounds y once.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fused_api.h"
#include "lora_api.h"
#include "ops.h"

namespace paged_cpu {
namespace {

// Rows from which a GEMM beats the row kernels: the fixed cost of a GEMM call and of widening the adapter's
// weights to fp32 is a few row-kernel tokens' work. Measured on 2 threads, SmolLM2's MLP (K 576, N 1728, R 48), one
// run of T tokens, us rows / GEMM: shrink fp32 T=8 12 / 17, T=16 18 / 19, T=32 33 / 21; bf16 T=16 21 / 33, T=32
// 34 / 37; expand fp32 T=8 19 / 20, T=16 33 / 26; bf16 T=8 27 / 37, T=16 49 / 44.
constexpr int64_t kShrinkGemmRows = 16;
constexpr int64_t kExpandGemmRows = 8;
// Multiply-adds one thread should have before the row kernels fork.
constexpr int64_t kParallelMacs = 1 << 17;

const LoraKernels& lora() {
  static const LoraKernels* const avx2 = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    return ok ? avx2_lora_kernels() : nullptr;
#else
    return static_cast<const LoraKernels*>(nullptr);
#endif
  }();
  if (avx2 != nullptr && std::strcmp(current_kernels().name, "scalar") != 0) return *avx2;
  return *scalar_lora_kernels();
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

at::Tensor unit_last(const at::Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous(); }

// How one call's tokens are multiplied.
struct Groups {
  struct Run {
    int64_t slot, begin, end;
  };
  std::vector<Run> runs;                        // GEMMs on row ranges
  std::vector<std::vector<int64_t>> gathered;   // per slot: tokens gathered into one GEMM (may be empty)
  std::vector<int64_t> single;                  // tokens for the row kernels
};

Groups group_tokens(const at::Tensor& slots, int64_t slot_count, int64_t gemm_rows, const char* op) {
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t tokens = slots.size(0);
  Groups g;
  g.gathered.resize(static_cast<size_t>(slot_count));
  for (int64_t t = 0; t < tokens;) {
    const int64_t slot = s[t];
    TORCH_CHECK(slot < slot_count, "paged_cpu.", op, ": token ", t, " has adapter slot ", slot, " but only ",
                slot_count, " slots are resident");
    int64_t end = t + 1;
    while (end < tokens && s[end] == slot) ++end;
    if (slot >= 0) {
      if (end - t >= gemm_rows) {
        g.runs.push_back({slot, t, end});
      } else {
        for (int64_t i = t; i < end; ++i) g.gathered[static_cast<size_t>(slot)].push_back(i);
      }
    }
    t = end;
  }
  for (auto& rest : g.gathered) {
    if (static_cast<int64_t>(rest.size()) < gemm_rows) {
      g.single.insert(g.single.end(), rest.begin(), rest.end());
      rest.clear();
    }
  }
  return g;
}

at::Tensor index_of(const std::vector<int64_t>& rows) {
  return at::from_blob(const_cast<int64_t*>(rows.data()), {static_cast<int64_t>(rows.size())}, at::kLong).clone();
}

// One slot's weights as fp32 (a view when they already are), widened at most once per call.
class Fp32Slots {
 public:
  explicit Fp32Slots(const at::Tensor& w) : w_(w), cache_(static_cast<size_t>(w.size(0))) {}
  const at::Tensor& operator[](int64_t slot) {
    at::Tensor& c = cache_[static_cast<size_t>(slot)];
    if (!c.defined()) c = w_.select(0, slot).to(at::kFloat);
    return c;
  }

 private:
  at::Tensor w_;
  std::vector<at::Tensor> cache_;
};

void check_slots(const at::Tensor& slots, int64_t tokens, const char* op) {
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong && slots.device().is_cpu(), "paged_cpu.", op,
              ": slots must be a cpu int64 [tokens] tensor, got ", slots.scalar_type(), " ", slots.sizes());
  TORCH_CHECK(slots.size(0) == tokens, "paged_cpu.", op, ": ", tokens, " tokens but ", slots.size(0), " slots");
}

int64_t grain(int64_t macs_per_token) { return std::max<int64_t>(1, kParallelMacs / std::max<int64_t>(1, macs_per_token)); }

}  // namespace

at::Tensor lora_shrink(const at::Tensor& x_in, const at::Tensor& a_in, const at::Tensor& slots_in) {
  TORCH_CHECK(x_in.dim() == 2, "paged_cpu.lora_shrink: x must be [tokens, in_features], got ", x_in.sizes());
  TORCH_CHECK(a_in.dim() == 3 && a_in.size(2) == x_in.size(1), "paged_cpu.lora_shrink: a must be [slots, rank, ",
              x_in.size(1), "], got ", a_in.sizes());
  const int64_t tokens = x_in.size(0), rank = a_in.size(1), k = x_in.size(1);
  check_slots(slots_in, tokens, "lora_shrink");
  const at::Tensor x = unit_last(x_in), a = a_in.contiguous(), slots = slots_in.contiguous();
  at::Tensor out = at::zeros({tokens, rank}, x.options().dtype(at::kFloat));
  if (tokens == 0 || rank == 0) return out;
  const Groups g = group_tokens(slots, a.size(0), kShrinkGemmRows, "lora_shrink");
  Fp32Slots a32(a);
  for (const auto& run : g.runs) {
    at::Tensor rows = out.narrow(0, run.begin, run.end - run.begin);
    at::mm_out(rows, x.narrow(0, run.begin, run.end - run.begin).to(at::kFloat), a32[run.slot].t());
  }
  for (size_t slot = 0; slot < g.gathered.size(); ++slot) {
    if (g.gathered[slot].empty()) continue;
    const at::Tensor idx = index_of(g.gathered[slot]);
    out.index_copy_(0, idx, at::mm(x.index_select(0, idx).to(at::kFloat), a32[static_cast<int64_t>(slot)].t()));
  }
  if (!g.single.empty()) {
    LoraShrinkArgs args{};
    args.x = x.data_ptr();
    args.ldx = x.stride(0);
    args.x_type = elem_of(x, "lora_shrink", "x");
    args.a = a.data_ptr();
    args.a_type = elem_of(a, "lora_shrink", "a");
    args.rank = rank;
    args.in_features = k;
    args.tokens = g.single.data();
    args.slots = slots.data_ptr<int64_t>();
    args.out = out.data_ptr<float>();
    const LoraShrinkFn fn = lora().shrink;
    at::parallel_for(0, static_cast<int64_t>(g.single.size()), grain(rank * k),
                     [&](int64_t begin, int64_t end) { fn(args, begin, end); });
  }
  return out;
}

void lora_expand(const at::Tensor& y, const at::Tensor& shrunk_in, const at::Tensor& b_in, const at::Tensor& slots_in) {
  TORCH_CHECK(y.dim() == 2, "paged_cpu.lora_expand: y must be [tokens, out_features], got ", y.sizes());
  const int64_t tokens = y.size(0), n = y.size(1);
  TORCH_CHECK(b_in.dim() == 3 && b_in.size(1) == n, "paged_cpu.lora_expand: b must be [slots, ", n, ", rank], got ",
              b_in.sizes());
  const int64_t rank = b_in.size(2);
  TORCH_CHECK(shrunk_in.dim() == 2 && shrunk_in.size(0) == tokens && shrunk_in.size(1) == rank,
              "paged_cpu.lora_expand: shrunk must be [", tokens, ", ", rank, "], got ", shrunk_in.sizes());
  check_slots(slots_in, tokens, "lora_expand");
  const Elem y_type = elem_of(y, "lora_expand", "y");
  if (tokens == 0 || n == 0) return;
  if (n > 1 && y.stride(1) != 1) {  // the kernels write rows with unit stride: go through a copy
    at::Tensor tmp = y.contiguous();
    lora_expand(tmp, shrunk_in, b_in, slots_in);
    y.copy_(tmp);
    return;
  }
  const at::Tensor shrunk = unit_last(shrunk_in.to(at::kFloat)), b = b_in.contiguous(), slots = slots_in.contiguous();
  const Groups g = group_tokens(slots, b.size(0), kExpandGemmRows, "lora_expand");
  Fp32Slots b32(b);
  for (const auto& run : g.runs) {
    at::Tensor rows = y.narrow(0, run.begin, run.end - run.begin);
    const at::Tensor s = shrunk.narrow(0, run.begin, run.end - run.begin);
    if (y_type == Elem::F32) {
      rows.addmm_(s, b32[run.slot].t());
    } else {
      rows.copy_(at::mm(s, b32[run.slot].t()).add_(rows));
    }
  }
  for (size_t slot = 0; slot < g.gathered.size(); ++slot) {
    if (g.gathered[slot].empty()) continue;
    const at::Tensor idx = index_of(g.gathered[slot]);
    const at::Tensor sum = at::mm(shrunk.index_select(0, idx), b32[static_cast<int64_t>(slot)].t());
    y.index_copy_(0, idx, sum.add_(y.index_select(0, idx)).to(y.scalar_type()));
  }
  if (!g.single.empty()) {
    LoraExpandArgs args{};
    args.y = y.data_ptr();
    args.ldy = y.stride(0);
    args.y_type = y_type;
    args.shrunk = shrunk.data_ptr<float>();
    args.lds = shrunk.stride(0);
    args.b = b.data_ptr();
    args.b_type = elem_of(b, "lora_expand", "b");
    args.rank = rank;
    args.out_features = n;
    args.tokens = g.single.data();
    args.slots = slots.data_ptr<int64_t>();
    const LoraExpandFn fn = lora().expand;
    at::parallel_for(0, static_cast<int64_t>(g.single.size()), grain(rank * n),
                     [&](int64_t begin, int64_t end) { fn(args, begin, end); });
  }
}

}  // namespace paged_cpu
