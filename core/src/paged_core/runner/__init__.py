"""The model runner: one forward per scheduler step (batches, executors, attention routing, the fused decoder)."""
