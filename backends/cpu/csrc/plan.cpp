// Planning: every row is validated (cheap, O(rows)); block ids only under PAGED_CPU_DEBUG (O(blocks read)).
#include "plan.h"

#include <algorithm>

namespace paged_cpu {
namespace {

struct Tile {
  int32_t row, q_start, q_count, first_pos, k_begin, k_end;
};

// The first key a tile reads: its first token's window start, down to a 16-key group (in the same block).
// Keys before it are outside every window of the tile, and so are never read: their blocks may be stale.
int32_t first_key(int64_t first_pos, int64_t window) {
  if (window <= 0 || first_pos < window) return 0;
  return static_cast<int32_t>((first_pos - window + 1) / kKeyGroup * kKeyGroup);
}

// Key splits (flash-decoding) start at fixed key positions, multiples of this, whatever the batch: a row's keys
// are then reduced in the same pieces, chunks and order whether it decodes alone, among other rows, or as one
// row of a prefill tile (batch invariance: the conformance suite checks it bit for bit). A multiple of every
// chunk length (kernel_api.h), so chunks inside a piece start at fixed positions too. 512 keys: long enough
// that a split's partial record and merge are small beside its work, short enough that one long decode row
// still gives two threads several pieces (a 4k context: 8).
constexpr int64_t kSplitKeys = 512;
static_assert(kSplitKeys % kMaxChunk == 0, "pieces must start at chunk boundaries");

void check_block_ids(const int32_t* ids, int64_t row, int64_t first, int64_t count, int64_t num_blocks) {
  for (int64_t i = first; i < count; ++i)
    TORCH_CHECK(ids[i] >= 0 && ids[i] < num_blocks, "paged_cpu: block_table[", row, "][", i, "] = ", ids[i],
                " is out of range for a cache of ", num_blocks, " blocks (PAGED_CPU_DEBUG bounds check)");
}

std::vector<Tile> make_tiles(const Shape& shape, const int32_t* qsl, const int32_t* lens, const at::Tensor& table,
                             int32_t q_tile, bool debug) {
  const int64_t rows = table.size(0), width = table.size(1);
  TORCH_CHECK(qsl[0] >= 0, "paged_cpu: query_start_loc[0] is ", qsl[0], ", must be >= 0");
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < rows; ++b) {
    const int32_t q0 = qsl[b], q1 = qsl[b + 1], len = lens[b], q_len = q1 - q0;
    TORCH_CHECK(q_len >= 0 && q1 <= shape.tokens, "paged_cpu: row ", b, ": query_start_loc [", q0, ", ", q1,
                ") is not an increasing range inside ", shape.tokens, " tokens");
    TORCH_CHECK(len >= q_len, "paged_cpu: row ", b, ": seq_len ", len, " < query_len ", q_len);
    if (q_len == 0) continue;  // an empty row (graph padding) gets no work
    const int64_t blocks = (len + shape.block_size - 1) / shape.block_size;
    TORCH_CHECK(blocks <= width, "paged_cpu: row ", b, ": seq_len ", len, " needs ", blocks,
                " blocks, the block table has ", width);
    const int32_t context = len - q_len;
    if (debug) {  // the blocks the row reads: from its first token's window on
      const int64_t skip = first_key(context, shape.sliding_window) / shape.block_size;
      check_block_ids(table.data_ptr<int32_t>() + b * table.stride(0), b, skip, blocks, shape.num_blocks);
    }
    for (int32_t t0 = 0; t0 < q_len; t0 += q_tile) {
      const int32_t count = std::min(q_tile, q_len - t0);
      const int32_t pos = context + t0;
      tiles.push_back({static_cast<int32_t>(b), q0 + t0, count, pos, first_key(pos, shape.sliding_window),
                       pos + count});
    }
  }
  return tiles;
}

}  // namespace

Plan make_plan(const Shape& shape, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
               const at::Tensor& block_table, int64_t split_tokens, bool debug) {
  const int64_t group = shape.heads / shape.kv_heads;
  // Prefill tiles hold about 32 query rows (tokens x group), so each staged key serves many rows.
  const auto q_tile = static_cast<int32_t>(std::max<int64_t>(1, 32 / group));
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  const std::vector<Tile> tiles = make_tiles(shape, qsl, seq_lens.data_ptr<int32_t>(), block_table, q_tile, debug);
  Plan plan;
  plan.used_tokens = qsl[seq_lens.size(0)];
  // An item covers a run of KV heads (their tiles are adjacent in a block), up to about 512 bytes per key.
  const int64_t elem = shape.kv_elem_size;
  const auto heads_per_item = static_cast<int32_t>(
      std::clamp<int64_t>(512 / (shape.head_size * elem), 1, std::min<int64_t>(shape.kv_heads, kMaxItemHeads)));
  const int64_t items_per_tile = (shape.kv_heads + heads_per_item - 1) / heads_per_item;
  // split_tokens > 0 (tests) forces another piece length; it must keep pieces at whole 16-key groups.
  const int64_t split = split_tokens > 0 ? (split_tokens + kKeyGroup - 1) / kKeyGroup * kKeyGroup : kSplitKeys;
  for (const Tile& t : tiles) {
    // Pieces [s * split, (s + 1) * split): the same boundaries for every row that reaches them; those wholly
    // before the tile's first key (a sliding window) are not made.
    const int64_t piece = split;
    const int64_t s0 = t.k_begin / piece;
    const int64_t pieces = (t.k_end + piece - 1) / piece - s0;
    for (int32_t h = 0; h < shape.kv_heads; h += heads_per_item) {
      const int32_t count = std::min<int32_t>(heads_per_item, static_cast<int32_t>(shape.kv_heads) - h);
      const int32_t rows = count * t.q_count * static_cast<int32_t>(group);
      plan.max_rows = std::max<int64_t>(plan.max_rows, rows);
      const int64_t record = partial_floats(rows, shape.head_size);
      if (pieces > 1) {
        plan.merges.push_back({plan.partial_floats, record, static_cast<int32_t>(pieces), rows, t.q_start,
                               t.q_count, h});
      }
      for (int64_t s = 0; s < pieces; ++s) {
        const auto begin = static_cast<int32_t>(std::max<int64_t>(t.k_begin, (s0 + s) * piece));
        const auto end = static_cast<int32_t>(std::min<int64_t>(t.k_end, (s0 + s + 1) * piece));
        const int64_t offset = pieces > 1 ? plan.partial_floats + s * record : -1;
        plan.items.push_back({t.row, h, count, t.q_start, t.q_count, t.first_pos, begin, end, offset});
      }
      if (pieces > 1) plan.partial_floats += pieces * record;
    }
  }
  // Longest first, so the dynamic hand-out ends with short items and threads finish together.
  std::stable_sort(plan.items.begin(), plan.items.end(), [](const WorkItem& a, const WorkItem& b) {
    return static_cast<int64_t>(a.k_end - a.k_begin) * a.q_count * a.kv_count >
           static_cast<int64_t>(b.k_end - b.k_begin) * b.q_count * b.kv_count;
  });
  return plan;
}

}  // namespace paged_cpu
