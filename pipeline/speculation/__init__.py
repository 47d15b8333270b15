"""Speculative decoding: the `speculative.*` keys (keys) and acceptance from a
published table (published_acceptance)."""
