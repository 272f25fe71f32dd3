// The attention algorithm, written once over per-ISA primitives.
//
// Included by each kernel translation unit inside its own namespace, after it
// defines: kBf16Dot, stage_rows<K, D>, stage_pairs<K, D>, dot_pairs<D>, axpy_rows<D>,
// scale_max, exp_sum, scale_vec, widen_f16, and (used only when kBf16Dot) dot_pairs_bf16<K, D>,
// axpy_rows_bf16<K, D>, finish_acc<D>, to_bf16.
// The dot and axpy primitives call tick() once per step of their inner loop, which paces the
// prefetch of the next chunk.
//
// One work item is a tile of query tokens of one row against a run of KV heads
// and a range of keys. The tokens * group query rows of a KV head share every
// key and value read (GQA: a KV block is read once per group of query heads).
// Keys are taken in chunks of whole 16-key groups, the chunks ending at multiples
// of the chunk length (absolute key positions, so a row sums its keys in the same
// pieces whichever item holds it); per chunk and head: scores for all rows (keys in
// the pair layout of kernel_api.h), an online-softmax update, then the
// probability-weighted values. Each row sees the keys in [window start, own position]:
// the others are masked to exact zeros, and an item never starts before its first
// row's window (block-table entries wholly before it are never read).
//
// Quantized caches (I8, E4M3, E5M2) are read in place: elements are widened to fp32 (or
// to bf16, exactly, in registers, for bf16 dot products), the dot products run on the unscaled
// elements, and each key's scale multiplies its score, each value's scale its weight
// (sum_j p_j * (s_j * v_j) = sum_j (p_j * s_j) * v_j): two multiplies per key and row
// instead of one per element, all in fp32.

// The next chunk's key and value lines, requested a few at a time as the current chunk's work ticks.
// Blocks sit anywhere in memory, out of the hardware prefetcher's sight, so the requests are made in
// software, spread evenly over the chunk's work (a burst stalls on the core's few miss buffers) and
// aimed at L2 (into L1 they would evict the chunk in use).
class ChunkPrefetch {
 public:
  // Forgets the spans; the lines per tick follow from the ticks the previous chunk took.
  void restart() {
    per_tick_ = ticks_ > 0 && lines_ > 0 ? (lines_ + ticks_ - 1) / ticks_ : 4;
    lines_ = ticks_ = count_ = cur_ = 0;
  }
  // Adds the bytes [begin, begin + bytes).
  void add(const void* begin, int64_t bytes) {
    const auto* b = static_cast<const char*>(begin);
    if (count_ == 0) at_ = b;
    spans_[count_++] = {b, b + bytes};
    lines_ += static_cast<int>((bytes + 63) / 64);
  }
  void operator()() {
    ++ticks_;
    issue(per_tick_);
  }
  // Requests whatever is left (the last chunk of an item is shorter than the one it prefetches).
  void finish() { issue(lines_); }

 private:
  struct Span {
    const char* begin;
    const char* end;
  };
  void issue(int lines) {
    while (lines > 0 && cur_ < count_) {
      const char* end = spans_[cur_].end;
      for (; lines > 0 && at_ < end; --lines, at_ += 64) __builtin_prefetch(at_, 0, 2);  // locality 2: into L2
      if (at_ >= end && ++cur_ < count_) at_ = spans_[cur_].begin;
    }
  }
  Span spans_[2 * kMaxChunk / kKeyGroup];  // keys and values of each block a chunk touches
  const char* at_ = nullptr;
  int count_ = 0, cur_ = 0;
  int lines_ = 0, ticks_ = 0, per_tick_ = 4;
};

template <KvType K, int D>
void attend_item_t(const AttnProblem& p, const WorkItem& w, float* ws, float* partials) {
  constexpr int64_t elem = kv_elem_bytes(K);
  constexpr bool quant = is_quantized(K);
  constexpr int kMaxGroups = kMaxChunk / kKeyGroup;
  const int G = p.num_heads / p.num_kv_heads;
  const int per_head = w.q_count * G;  // rows of one KV head
  const int M = w.kv_count * per_head;
  const int CH = chunk_tokens(D);
  float* q = ws;
  auto* qb = reinterpret_cast<uint16_t*>(q + static_cast<int64_t>(M) * D);
  float* s = q + 2 * static_cast<int64_t>(M) * D;
  float* kbuf = s + static_cast<int64_t>(M) * CH;
  float* vbuf = kbuf + static_cast<int64_t>(CH) * D;
  float* mx = vbuf + static_cast<int64_t>(CH) * D;
  float* sum = mx + M;
  float* acc = sum + M;
  // [buffer][head][group]: where this chunk's and the next chunk's 16-key groups start.
  const char* kgroup[2][kMaxItemHeads][kMaxGroups];
  const char* vgroup[2][kMaxItemHeads][kMaxGroups];
  // Quantized caches: where those groups' 16 float16 scales start in the key plane (the value plane's
  // are at the same offset from its tile).
  const char* sgroup[2][kMaxItemHeads][kMaxGroups];
  float kscale[kMaxChunk], vscale[kMaxChunk];  // this chunk's scales, times staged_unit (and the keys' by p.scale)
  const float* kf[kMaxGroups];
  const float* vf[kMaxChunk];
  const void* hv[kMaxChunk];

  for (int hh = 0; hh < w.kv_count; ++hh) {
    for (int t = 0; t < w.q_count; ++t) {
      const int64_t head0 = static_cast<int64_t>(w.kv_head + hh) * G;
      const float* src = p.q + ((static_cast<int64_t>(w.q_start) + t) * p.num_heads + head0) * D;
      float* dst = q + (static_cast<int64_t>(hh) * per_head + t * G) * D;
      for (int i = 0; i < G * D; ++i) dst[i] = src[i];
    }
  }
  // bf16 queries meet bf16 keys (or quantized ones widened to bf16, exactly) in bf16 dot products.
  const bool bf16_dot = kBf16Dot && (K == KvType::BF16 || quant) && p.bf16_query;
  if (bf16_dot) to_bf16(q, M * D, qb);
  const bool bf16_pv = bf16_dot && D % 32 == 0;  // values through bf16 pair dot products too
  for (int r = 0; r < M; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.0f;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(M) * D; ++i) acc[i] = 0.0f;

  const int32_t* table = p.block_table + w.row * p.table_stride;
  const auto* kcache = static_cast<const char*>(p.k_cache);
  const auto* vcache = static_cast<const char*>(p.v_cache);
  const int bs = p.block_size;
  const int64_t pair_stride = 2 * static_cast<int64_t>(bs);  // elements between a key group's dimension pairs
  const int64_t scale_row = static_cast<int64_t>(bs) * D;    // quantized: bytes from a tile to its scales
  const float key_unit = staged_unit(K) * p.scale;            // folded into the key scales
  const float score_scale = quant ? 1.0f : p.scale;

  // Byte offset, in either plane, of the tile of the item's KV head `hh` in the block holding `key`.
  auto tile_of = [&](int key, int hh) {
    return (table[key / bs] * p.block_stride + (w.kv_head + hh) * p.head_stride) * elem;
  };
  // Group starts of keys [c0, c0 + n) (c0 a multiple of 16: a group never crosses a block).
  auto locate = [&](int c0, int n, int buf) {
    for (int g = 0; g * kKeyGroup < n; ++g) {
      const int key = c0 + g * kKeyGroup;
      const int off = key % bs;
      for (int hh = 0; hh < w.kv_count; ++hh) {
        const int64_t tile = tile_of(key, hh);
        kgroup[buf][hh][g] = kcache + tile + 2 * off * elem;
        vgroup[buf][hh][g] = vcache + tile + static_cast<int64_t>(off) * D * elem;
        if constexpr (quant) sgroup[buf][hh][g] = kcache + tile + scale_row + 2 * off;
      }
    }
  };
  // Chunks end at multiples of CH (and at the item's end): fixed key positions whatever the item's start.
  auto chunk_end = [&](int c) { return (c / CH + 1) * CH < w.k_end ? (c / CH + 1) * CH : w.k_end; };
  // Chunk i is computed while the lines of chunk i + 1 are requested (two chunks ahead measured slower).
  ChunkPrefetch prefetch;
  int prefetched_block = w.k_begin / bs;  // the first chunk's blocks are not prefetched
  locate(w.k_begin, chunk_end(w.k_begin) - w.k_begin, 0);
  for (int c0 = w.k_begin, cur = 0; c0 < w.k_end; c0 = chunk_end(c0), cur ^= 1) {
    const int n = chunk_end(c0) - c0;
    const int ng = (n + kKeyGroup - 1) / kKeyGroup;
    const int c1 = c0 + n;
    prefetch.restart();
    if (c1 < w.k_end) {
      const int n1 = chunk_end(c1) - c1;
      locate(c1, n1, cur ^ 1);
      // Whole blocks, each once: the item's key tiles of a block are adjacent, and so are its value tiles.
      for (int key = c1; key < c1 + n1; key = (key / bs + 1) * bs) {
        if (key / bs == prefetched_block) continue;
        prefetched_block = key / bs;
        const int64_t tile = tile_of(key, 0);
        prefetch.add(kcache + tile, w.kv_count * p.head_stride * elem);
        prefetch.add(vcache + tile, w.kv_count * p.head_stride * elem);
      }
    }
    for (int hh = 0; hh < w.kv_count; ++hh) {
      const int64_t hq = static_cast<int64_t>(hh) * per_head * D;  // this head's rows in q, qb and acc
      float* sh = s + static_cast<int64_t>(hh) * per_head * CH;
      const char* const* kg = kgroup[cur][hh];
      if constexpr (quant) {
        for (int g = 0; g < ng; ++g) {
          const auto* sc = reinterpret_cast<const uint16_t*>(sgroup[cur][hh][g]);
          widen_f16(sc, kKeyGroup, key_unit, kscale + g * kKeyGroup);
          widen_f16(reinterpret_cast<const uint16_t*>(reinterpret_cast<const char*>(sc) + (vcache - kcache)),
                    kKeyGroup, staged_unit(K), vscale + g * kKeyGroup);
        }
      }
      if (bf16_dot) {
        dot_pairs_bf16<K, D>(qb + hq, per_head, reinterpret_cast<const void* const*>(kg), ng, pair_stride, sh, CH,
                             prefetch, reinterpret_cast<uint16_t*>(kbuf));
      } else if (K == KvType::F32) {
        dot_pairs<D>(q + hq, per_head, reinterpret_cast<const float* const*>(kg), ng, pair_stride, sh, CH, prefetch);
      } else {
        stage_pairs<K, D>(reinterpret_cast<const void* const*>(kg), ng, pair_stride, kbuf);
        for (int g = 0; g < ng; ++g) kf[g] = kbuf + static_cast<int64_t>(g) * kKeyGroup * D;
        dot_pairs<D>(q + hq, per_head, kf, ng, 2 * kKeyGroup, sh, CH, prefetch);
      }
      for (int r = hh * per_head; r < (hh + 1) * per_head; ++r) {
        float* sr = s + static_cast<int64_t>(r) * CH;
        const int pos = w.first_pos + (r - hh * per_head) / G;
        // Visible keys of this chunk: [lo, hi), from the row's window start to its own position.
        const int first = p.sliding_window > 0 ? pos - p.sliding_window + 1 - c0 : 0;
        const int lo = first > 0 ? first : 0;
        const int hi = pos - c0 + 1 < n ? pos - c0 + 1 : n;
        if (hi <= lo) {
          for (int j = 0; j < n; ++j) sr[j] = 0.0f;
          continue;
        }
        if constexpr (quant)
          for (int j = lo; j < hi; ++j) sr[j] *= kscale[j];
        const float cm = scale_max(sr, lo, hi, score_scale, p.soft_cap);
        const float mnew = cm > mx[r] ? cm : mx[r];
        const float alpha = mx[r] == -INFINITY ? 0.0f : std::exp(mx[r] - mnew);
        const float chunk_sum = exp_sum(sr, lo, hi, mnew);
        for (int j = 0; j < lo; ++j) sr[j] = 0.0f;
        for (int j = hi; j < n; ++j) sr[j] = 0.0f;
        if constexpr (quant)
          for (int j = lo; j < hi; ++j) sr[j] *= vscale[j];
        if (alpha != 1.0f) scale_vec(acc + static_cast<int64_t>(r) * D, D, alpha);
        sum[r] = sum[r] * alpha + chunk_sum;
        mx[r] = mnew;
      }
      for (int j = 0; j < n; ++j) hv[j] = vgroup[cur][hh][j / kKeyGroup] + (j % kKeyGroup) * D * elem;
      if (bf16_pv) {
        axpy_rows_bf16<K, D>(acc + hq, per_head, sh, CH, hv, n, prefetch, reinterpret_cast<uint16_t*>(vbuf));
        continue;
      }
      if (K == KvType::F32) {
        for (int j = 0; j < n; ++j) vf[j] = static_cast<const float*>(hv[j]);
      } else {
        stage_rows<K, D>(hv, n, vbuf);
        for (int j = 0; j < n; ++j) vf[j] = vbuf + static_cast<int64_t>(j) * D;
      }
      axpy_rows<D>(acc + hq, per_head, sh, CH, vf, n, prefetch);
    }
    prefetch.finish();
  }

  if (bf16_pv) finish_acc<D>(acc, M);
  if (w.partial < 0) {
    for (int r = 0; r < M; ++r) {
      const int64_t t = w.q_start + (r % per_head) / G;
      const int64_t h = static_cast<int64_t>(w.kv_head + r / per_head) * G + r % G;
      float* dst = p.out + (t * p.num_heads + h) * D;
      const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
      const float* a = acc + static_cast<int64_t>(r) * D;
      for (int d = 0; d < D; ++d) dst[d] = a[d] * inv;
    }
  } else {
    float* rec = partials + w.partial;
    for (int r = 0; r < M; ++r) {
      rec[r] = mx[r];
      rec[M + r] = sum[r];
    }
    float* racc = rec + 2 * M;
    for (int64_t i = 0; i < static_cast<int64_t>(M) * D; ++i) racc[i] = acc[i];
  }
}

#define PAGED_CPU_HEAD_CASES(KV)                 \
  switch (p.head_size) {                         \
    case 64: return attend_item_t<KV, 64>(p, w, ws, partials);   \
    case 80: return attend_item_t<KV, 80>(p, w, ws, partials);   \
    case 96: return attend_item_t<KV, 96>(p, w, ws, partials);   \
    case 128: return attend_item_t<KV, 128>(p, w, ws, partials); \
    case 256: return attend_item_t<KV, 256>(p, w, ws, partials); \
    default: return;                             \
  }

// Entry point: dispatch on the cache's storage type and the head size (checked by the caller).
inline void attend_item(const AttnProblem& p, const WorkItem& w, float* ws, float* partials) {
  switch (p.kv_type) {
    case KvType::F32: PAGED_CPU_HEAD_CASES(KvType::F32)
    case KvType::BF16: PAGED_CPU_HEAD_CASES(KvType::BF16)
    case KvType::F16: PAGED_CPU_HEAD_CASES(KvType::F16)
    case KvType::I8: PAGED_CPU_HEAD_CASES(KvType::I8)
    case KvType::E4M3: PAGED_CPU_HEAD_CASES(KvType::E4M3)
    case KvType::E5M2: PAGED_CPU_HEAD_CASES(KvType::E5M2)
  }
}

#undef PAGED_CPU_HEAD_CASES
