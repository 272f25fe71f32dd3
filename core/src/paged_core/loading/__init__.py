"""Loading: model files, dtype and KV budget choices, and assembling an engine's parts."""
