"""The engine: model loading, the model runner, and the step loop joining scheduler, backend and sampler."""
