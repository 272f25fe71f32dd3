"""paged_core.cli."""
