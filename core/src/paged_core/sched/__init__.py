"""paged_core.sched."""
