"""The scheduler: one token budget per step (chunked prefill, prefix hits, drafts), recompute preemption."""
