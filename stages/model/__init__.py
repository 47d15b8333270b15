"""The model and its attention: transformer (the decoder), spec (a model's sizes, from a
config or a preset), rope, and attention/ (paged attention over the KV pool, the dense
reference, the CPU and Intel HPU ops)."""
