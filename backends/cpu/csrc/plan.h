// Work planning for one attention call: validate the batch, cut it into items, decide key splits.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "kernel_api.h"

namespace paged_cpu {

struct Shape {
  int64_t tokens, heads, kv_heads, head_size, num_blocks, block_size, kv_elem_size;
  int64_t sliding_window;  // > 0: a query sees only its last sliding_window keys (itself included)
};

// One tile whose keys were split over several items: where its partial records are, and where it writes.
struct MergeTask {
  int64_t first;   // float offset of split 0's record
  int64_t stride;  // floats between consecutive splits' records
  int32_t splits;
  int32_t rows;     // kv heads * q_count * group, head-major as in WorkItem
  int64_t q_start;
  int64_t q_count;
  int64_t kv_head;
};

struct Plan {
  std::vector<WorkItem> items;   // most expensive first
  std::vector<MergeTask> merges;
  int64_t partial_floats = 0;
  int64_t max_rows = 1;
  int64_t used_tokens = 0;       // tokens covered by rows; later ones are padding
};

// split_tokens > 0 forces the key-split length (tests); 0 takes the fixed one (plan.cpp: kSplitKeys).
Plan make_plan(const Shape& shape, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
               const at::Tensor& block_table, int64_t split_tokens, bool debug);

}  // namespace paged_cpu
