"""paged_core.memory."""
