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
  int cur = 0;
  locate(w.k_begin, w.k_end - w.k_begin < CH ? w.k_end - w.k_begin : CH, ptrs[0][0], ptrs[0][1]);
  for (int c0 = w.k_begin; c0 < w.k_end; c0 += CH, cur ^= 1) {
    const int n = w.k_end - c0 < CH ? w.k_end - c0 : CH;
    const void** kp = ptrs[cur][0];
    const void** vp = ptrs[cur][1];
    // Blocks sit anywhere in memory, out of the hardware prefetcher's sight: ask for the next chunk now.
    const int c1 = c0 + CH;
    if (c1 < w.k_end) {
      const int n1 = w.k_end - c1 < CH ? w.k_end - c1 : CH;
      locate(c1, n1, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1]);
      for (int j = 0; j < n1; ++j) {
        for (int64_t b = 0; b < slot_bytes; b += 64) {
          __builtin_prefetch(static_cast<const char*>(ptrs[cur ^ 1][0][j]) + b, 0, 2);
          __builtin_prefetch(static_cast<const char*>(ptrs[cur ^ 1][1][j]) + b, 0, 2);
        }
      }
    }
    for (int hh = 0; hh < w.kv_count; ++hh) {
      const int64_t hq = static_cast<int64_t>(hh) * per_head * D;  // this head's rows in q, qb and acc
      float* sh = s + static_cast<int64_t>(hh) * per_head * CH;
      for (int j = 0; j < n; ++j) {
        hk[j] = static_cast<const char*>(kp[j]) + hh * D * elem;
        hv[j] = static_cast<const char*>(vp[j]) + hh * D * elem;
      }
      if (bf16_dot) {
        dot_rows_bf16<D>(qb + hq, per_head, hk, n, sh, CH);
      } else {
        if (K == KvType::F32) {
          for (int j = 0; j < n; ++j) kf[j] = static_cast<const float*>(hk[j]);
        } else {
          stage_rows<K, D>(hk, n, kbuf);
          for (int j = 0; j < n; ++j) kf[j] = kbuf + static_cast<int64_t>(j) * D;
        }
        dot_rows<D>(q + hq, per_head, kf, n, sh, CH);
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
        axpy_rows_bf16<D>(acc + hq, per_head, sh, CH, hv, n);
        continue;
      }
      if (K == KvType::F32) {
        for (int j = 0; j < n; ++j) vf[j] = static_cast<const float*>(hv[j]);
      } else {
        stage_rows<K, D>(hv, n, vbuf);
        for (int j = 0; j < n; ++j) vf[j] = vbuf + static_cast<int64_t>(j) * D;
      }
      axpy_rows<D>(acc + hq, per_head, sh, CH, vf, n);
    }
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
