"""paged_core.reference."""
