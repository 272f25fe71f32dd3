"""KV-cache memory: the block pool, its LRU free queue, the chained-hash prefix cache and per-request block tables."""
