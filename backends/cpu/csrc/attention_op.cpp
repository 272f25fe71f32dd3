// paged_cpu::attention: checks the batch, plans work items, runs them on torch's threads, merges split keys.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "ops.h"
#include "plan.h"

namespace paged_cpu {

KvType kv_type_of(const at::Tensor& cache) {
  switch (cache.scalar_type()) {
    case at::kFloat: return KvType::F32;
    case at::kBFloat16: return KvType::BF16;
    case at::kHalf: return KvType::F16;
    case at::kChar: return KvType::I8;
    case at::kFloat8_e4m3fn: return KvType::E4M3;
    case at::kFloat8_e5m2: return KvType::E5M2;
    default: TORCH_CHECK(false, "paged_cpu: kv_cache dtype ", cache.scalar_type(),
                         " not supported (supported: float32, bfloat16, float16, int8, float8_e4m3fn, float8_e5m2)");
  }
}

namespace {

void check_inputs(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& qsl,
                  const at::Tensor& seq_lens, const at::Tensor& block_table) {
  TORCH_CHECK(query.dim() == 3, "paged_cpu: query must be [tokens, heads, head_size], got ", query.sizes());
  check_cache(kv_cache, "kv_cache");
  const int64_t extra = is_quantized(kv_type_of(kv_cache)) ? kScaleElements : 0;  // each vector's scale
  TORCH_CHECK(kv_cache.size(4) == query.size(2) + extra, "paged_cpu: kv_cache head_size ", kv_cache.size(4),
              " != query head_size ", query.size(2), extra ? " + 2 (a quantized cache's scale)" : "");
  const int64_t d = query.size(2);
  TORCH_CHECK(d == 64 || d == 80 || d == 96 || d == 128 || d == 256, "paged_cpu: head_size ", d,
              " not supported (supported: 64, 80, 96, 128, 256)");
  TORCH_CHECK(query.size(1) % kv_cache.size(2) == 0, "paged_cpu: ", query.size(1),
              " query heads are not a multiple of ", kv_cache.size(2), " KV heads");
  for (const at::Tensor* t : {&qsl, &seq_lens, &block_table})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->device().is_cpu(),
                "paged_cpu: query_start_loc, seq_lens and block_table must be int32 CPU tensors");
  TORCH_CHECK(seq_lens.dim() == 1 && qsl.dim() == 1 && qsl.size(0) == seq_lens.size(0) + 1,
              "paged_cpu: need query_start_loc [B+1] and seq_lens [B], got ", qsl.sizes(), " and ", seq_lens.sizes());
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == seq_lens.size(0) && block_table.stride(1) == 1,
              "paged_cpu: block_table must be [B, max_blocks] with unit column stride, got ", block_table.sizes());
}

// Combine the key splits of one tile: weights exp(m_s - max) rescale each split's sum and accumulator.
void merge_tile(const MergeTask& task, const float* partials, float* out, int64_t num_heads, int64_t group,
                int64_t head_size) {
  const int64_t rows = task.rows;
  for (int64_t r = 0; r < rows; ++r) {
    float top = -INFINITY;
    for (int32_t s = 0; s < task.splits; ++s) top = std::max(top, partials[task.first + s * task.stride + r]);
    const int64_t per_head = task.q_count * group;
    const int64_t token = task.q_start + (r % per_head) / group;
    const int64_t head = (task.kv_head + r / per_head) * group + r % group;
    float* dst = out + (token * num_heads + head) * head_size;
    std::fill(dst, dst + head_size, 0.0f);
    float total = 0.0f;
    for (int32_t s = 0; s < task.splits; ++s) {
      const float* rec = partials + task.first + s * task.stride;
      if (rec[r] == -INFINITY) continue;  // this split saw no key of this row
      const float w = std::exp(rec[r] - top);
      total += w * rec[rows + r];
      const float* acc = rec + 2 * rows + r * head_size;
      for (int64_t d = 0; d < head_size; ++d) dst[d] += w * acc[d];
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t d = 0; d < head_size; ++d) dst[d] *= inv;
  }
}

// Run fn(i) for i in [0, n) on torch's threads, handing out indices dynamically (items differ in cost).
template <typename Fn>
void run_dynamic(int64_t n, int64_t workspace, const Fn& fn) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  at::parallel_for(0, std::max<int64_t>(threads, 1), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ws(static_cast<size_t>(workspace));
    for (int64_t t = begin; t < end; ++t)
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, ws.data());
  });
}

}  // namespace

at::Tensor attention(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& query_start_loc,
                     const at::Tensor& seq_lens, const at::Tensor& block_table, double scale, int64_t split_tokens,
                     int64_t sliding_window, double soft_cap) {
  check_inputs(query, kv_cache, query_start_loc, seq_lens, block_table);
  TORCH_CHECK(sliding_window >= 0 && sliding_window <= INT32_MAX,
              "paged_cpu: sliding_window must be >= 0 (0: none), got ", sliding_window);
  TORCH_CHECK(soft_cap >= 0.0 && std::isfinite(soft_cap), "paged_cpu: soft_cap must be >= 0 (0: none), got ", soft_cap);
  const int64_t tokens = query.size(0), heads = query.size(1), head_size = query.size(2);
  const int64_t kv_heads = kv_cache.size(2), group = heads / kv_heads;
  at::Tensor q = query;
  if (q.scalar_type() != at::kFloat || !q.is_contiguous())
    q = at::empty({tokens, heads, head_size}, query.options().dtype(at::kFloat)).copy_(query);
  at::Tensor out = at::empty({tokens, heads, head_size}, query.options().dtype(at::kFloat));

  const Shape shape{tokens,           heads,           kv_heads,   head_size, kv_cache.size(1), kv_cache.size(3),
                    kv_cache.element_size(), sliding_window};
  const Plan plan = make_plan(shape, query_start_loc.contiguous(), seq_lens.contiguous(), block_table, split_tokens,
                              debug_checks());
  if (plan.used_tokens < tokens) out.narrow(0, plan.used_tokens, tokens - plan.used_tokens).zero_();

  AttnProblem p{};
  p.q = q.data_ptr<float>();
  p.out = out.data_ptr<float>();
  const int64_t plane = kv_cache.stride(0) * kv_cache.element_size();
  p.k_cache = kv_cache.data_ptr();
  p.v_cache = static_cast<const char*>(kv_cache.data_ptr()) + plane;
  p.kv_type = kv_type_of(kv_cache);
  p.block_stride = kv_cache.stride(1);
  p.head_stride = kv_cache.stride(2);
  p.block_table = block_table.data_ptr<int32_t>();
  p.table_stride = block_table.stride(0);
  p.num_heads = static_cast<int32_t>(heads);
  p.num_kv_heads = static_cast<int32_t>(kv_heads);
  p.head_size = static_cast<int32_t>(head_size);
  p.block_size = static_cast<int32_t>(kv_cache.size(3));
  p.scale = static_cast<float>(scale);
  p.bf16_query = query.scalar_type() == at::kBFloat16;
  p.sliding_window = static_cast<int32_t>(sliding_window);
  p.soft_cap = static_cast<float>(soft_cap);

  std::vector<float> partials(static_cast<size_t>(plan.partial_floats));
  const AttendFn attend = current_kernels().attend;
  run_dynamic(static_cast<int64_t>(plan.items.size()), workspace_floats(plan.max_rows, head_size),
              [&](int64_t i, float* ws) { attend(p, plan.items[i], ws, partials.data()); });
  if (!plan.merges.empty()) {
    at::parallel_for(0, static_cast<int64_t>(plan.merges.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        merge_tile(plan.merges[i], partials.data(), p.out, heads, group, head_size);
    });
  }
  return query.scalar_type() == at::kFloat ? out : out.to(query.scalar_type());
}

}  // namespace paged_cpu
