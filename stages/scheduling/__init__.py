"""Scheduling: which requests run in a step and which KV blocks they hold.

scheduler (the chunked, whole-prompt and static schedulers), running_rows (the rows of a
running batch), request (a request's state), kv_cache (the block pool) with prefix_cache
(shared prompt prefixes) and block_hashes (naming blocks by content), decode_runs (runs of
identical decode steps a simulated device leaps over), step_rows, stopping.
"""
