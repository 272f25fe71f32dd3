"""paged_core.graph."""
