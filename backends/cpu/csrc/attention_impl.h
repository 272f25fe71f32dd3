// The attention algorithm, written once over per-ISA primitives.
//
// Included by each kernel translation unit inside its own namespace, after it
// defines: kBf16Dot, stage_rows<K, D>, dot_rows<D>, axpy_rows<D>, scale_max,
// exp_sum, scale_vec, and (used only when kBf16Dot) dot_rows_bf16<D>,
// axpy_rows_bf16<D>, finish_acc<D>, to_bf16.
//
// One work item is a tile of query tokens of one row against a run of KV heads
// and a range of keys (whole slots: contiguous memory). The tokens * group query
// rows of a KV head share every key and value read (GQA: a KV block is read once
// per group of query heads). Keys are taken
// in chunks; per chunk: scores for all M rows, an online-softmax update, then
// the probability-weighted values. Keys past a row's own position are masked.

// A chunk's key and value slots to prefetch, handed out a few slots at a time.
struct ChunkPrefetch {
  const void* const* keys = nullptr;
  const void* const* values = nullptr;
  int64_t slot_bytes = 0;
  int total = 0;  // slots
  int next = 0;
  ChunkPrefetch() = default;
  ChunkPrefetch(const void* const* k, const void* const* v, int n, int64_t bytes)
      : keys(k), values(v), slot_bytes(bytes), total(n) {}
  // Requests every line of slots up to `stop` (exclusive): one prefetch per 64-byte line of K and of V.
  void issue_until(int stop) {
    for (; next < stop && next < total; ++next) {
      const char* k = static_cast<const char*>(keys[next]);
      const char* v = static_cast<const char*>(values[next]);
      for (int64_t b = 0; b < slot_bytes; b += 64) {
        __builtin_prefetch(k + b, 0, 2);  // locality 2: into L2 (measured: L1 hints thrash)
        __builtin_prefetch(v + b, 0, 2);
      }
    }
  }
};

template <KvType K, int D>
void attend_item_t(const AttnProblem& p, const WorkItem& w, float* ws, float* partials) {
  constexpr int64_t elem = K == KvType::F32 ? 4 : 2;
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
  const void* ptrs[2][2][64];  // [buffer][keys, values][token]: this chunk's and the next one's
  const float* kf[64];
  const float* vf[64];
  const void* hk[64];
  const void* hv[64];

  for (int hh = 0; hh < w.kv_count; ++hh) {
    for (int t = 0; t < w.q_count; ++t) {
      const int64_t head0 = static_cast<int64_t>(w.kv_head + hh) * G;
      const float* src = p.q + ((static_cast<int64_t>(w.q_start) + t) * p.num_heads + head0) * D;
      float* dst = q + (static_cast<int64_t>(hh) * per_head + t * G) * D;
      for (int i = 0; i < G * D; ++i) dst[i] = src[i];
    }
  }
  const bool bf16_dot = kBf16Dot && K == KvType::BF16 && p.bf16_query;
  if (bf16_dot) to_bf16(q, M * D, qb);
  const bool bf16_pv = bf16_dot && D % 32 == 0;  // values through bf16 pair dot products too
  for (int r = 0; r < M; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.0f;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(M) * D; ++i) acc[i] = 0.0f;

  const int32_t* table = p.block_table + w.row * p.table_stride;
  const char* kbase = static_cast<const char*>(p.k_cache) + static_cast<int64_t>(w.kv_head) * D * elem;
  const char* vbase = static_cast<const char*>(p.v_cache) + static_cast<int64_t>(w.kv_head) * D * elem;
  const int64_t slot_bytes = static_cast<int64_t>(w.kv_count) * D * elem;  // the item's heads of one slot
  const int bs = p.block_size;

  // Slot addresses of keys/values [c0, c0 + n) through the block table.
  auto locate = [&](int c0, int n, const void** kp, const void** vp) {
    int blk = c0 / bs;
    int off = c0 - blk * bs;
    for (int j = 0; j < n; ++j) {
      const int64_t idx = static_cast<int64_t>(table[blk]) * p.block_stride + off * p.token_stride;
      kp[j] = kbase + idx * elem;
      vp[j] = vbase + idx * elem;
      if (++off == bs) {
        off = 0;
        ++blk;
      }
    }
  };
  // Chunk i is computed while the lines of chunk i + 1 are requested (two chunks ahead measured slower).
  // Blocks sit anywhere in memory, out of the hardware prefetcher's sight, so the requests are made in
  // software, spread over the chunk's work (a burst would stall on the core's few miss buffers) and
  // aimed at L2 (into L1 they would evict the chunk in use).
  auto chunk_len = [&](int c) { return w.k_end - c < CH ? w.k_end - c : CH; };
  locate(w.k_begin, chunk_len(w.k_begin), ptrs[0][0], ptrs[0][1]);
  for (int c0 = w.k_begin, cur = 0; c0 < w.k_end; c0 += CH, cur ^= 1) {
    const int n = chunk_len(c0);
    const void** kp = ptrs[cur][0];
    const void** vp = ptrs[cur][1];
    const int c1 = c0 + CH;
    ChunkPrefetch pf;
    if (c1 < w.k_end) {
      locate(c1, chunk_len(c1), ptrs[cur ^ 1][0], ptrs[cur ^ 1][1]);
      pf = ChunkPrefetch(ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], chunk_len(c1), slot_bytes);
    }
    // The next chunk's slots are spread evenly over this chunk's work: groups of 16 keys while scoring,
    // of 8 while summing values (finer-grained requests overlap the memory traffic better).
    const int groups = w.kv_count * ((n + 15) / 16 + (n + 7) / 8);
    int group = 0;
    auto step = [&](int count) {
      group += count;
      pf.issue_until(static_cast<int>((static_cast<int64_t>(pf.total) * group + groups - 1) / groups));
    };
    for (int hh = 0; hh < w.kv_count; ++hh) {
      const int64_t hq = static_cast<int64_t>(hh) * per_head * D;  // this head's rows in q, qb and acc
      float* sh = s + static_cast<int64_t>(hh) * per_head * CH;
      for (int j = 0; j < n; ++j) {
        hk[j] = static_cast<const char*>(kp[j]) + hh * D * elem;
        hv[j] = static_cast<const char*>(vp[j]) + hh * D * elem;
      }
      if (bf16_dot) {
        for (int j0 = 0; j0 < n; j0 += 16) {
          dot_rows_bf16<D>(qb + hq, per_head, hk + j0, n - j0 < 16 ? n - j0 : 16, sh + j0, CH);
          step(1);
        }
      } else {
        if (K == KvType::F32) {
          for (int j = 0; j < n; ++j) kf[j] = static_cast<const float*>(hk[j]);
        } else {
          stage_rows<K, D>(hk, n, kbuf);
          for (int j = 0; j < n; ++j) kf[j] = kbuf + static_cast<int64_t>(j) * D;
        }
        dot_rows<D>(q + hq, per_head, kf, n, sh, CH);
        step((n + 15) / 16);
      }
      for (int r = hh * per_head; r < (hh + 1) * per_head; ++r) {
        float* sr = s + static_cast<int64_t>(r) * CH;
        const int pos = w.first_pos + (r - hh * per_head) / G;
        const int visible = pos - c0 + 1 < n ? pos - c0 + 1 : n;  // causal: keys up to the row's position
        if (visible <= 0) {
          for (int j = 0; j < n; ++j) sr[j] = 0.0f;
          continue;
        }
        const float cm = scale_max(sr, visible, p.scale);
        const float mnew = cm > mx[r] ? cm : mx[r];
        const float alpha = mx[r] == -INFINITY ? 0.0f : std::exp(mx[r] - mnew);
        const float chunk_sum = exp_sum(sr, visible, mnew);
        for (int j = visible; j < n; ++j) sr[j] = 0.0f;
        if (alpha != 1.0f) scale_vec(acc + static_cast<int64_t>(r) * D, D, alpha);
        sum[r] = sum[r] * alpha + chunk_sum;
        mx[r] = mnew;
      }
      if (bf16_pv) {
        for (int j0 = 0; j0 < n; j0 += 8) {
          axpy_rows_bf16<D>(acc + hq, per_head, sh + j0, CH, hv + j0, n - j0 < 8 ? n - j0 : 8);
          step(1);
        }
        continue;
      }
      if (K == KvType::F32) {
        for (int j = 0; j < n; ++j) vf[j] = static_cast<const float*>(hv[j]);
      } else {
        stage_rows<K, D>(hv, n, vbuf);
        for (int j = 0; j < n; ++j) vf[j] = vbuf + static_cast<int64_t>(j) * D;
      }
      axpy_rows<D>(acc + hq, per_head, sh, CH, vf, n);
      step((n + 7) / 8);
    }
    pf.issue_until(pf.total);  // whatever is left (a chunk with fewer keys than the next one)
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
  }
}

#undef PAGED_CPU_HEAD_CASES
