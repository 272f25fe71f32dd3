"""The backend contract: what a hardware vendor implements (re-exported by :mod:`paged_core.api`)."""
