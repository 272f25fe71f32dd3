"""Benchmark workloads and baselines (the fixed, seeded workloads named in the design brief)."""
