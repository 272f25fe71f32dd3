"""The checks `paged-conformance run` collects (files named ``check_*.py``; ordinary pytest runs skip them)."""
