"""The GPU engine: paged KV caches, continuous batching of decoders, batched encoders and VAD, behind the same
ModelPort as the CPU backends (serving/threads.py)."""
