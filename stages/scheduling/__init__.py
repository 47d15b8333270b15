"""Scheduling: which requests run in a step and which KV blocks they hold.

scheduler (the chunked, whole-prompt and static schedulers), request_table (the running
requests and their numbers), request (a request's identity, tokens and times), kv_cache (the
block pool) with prefix_cache (shared prompt prefixes) and block_hashes (naming blocks by
content), run_updates (a planned run of decode steps applied at once), step_rows, stopping.
"""
