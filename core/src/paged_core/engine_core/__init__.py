"""The engine core: scheduler, model runner and sampler stepped together, its wire messages and its process loop."""
