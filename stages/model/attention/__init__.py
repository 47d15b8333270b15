"""Attention stages: HPU-style paged attention over a block pool, and the dense reference."""
