"""paged_core.registry."""
