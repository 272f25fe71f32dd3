"""Process helpers shared by the CLI, the engine core and parallel workers (runtime preload, logging)."""
