"""Sampling: sampler (greedy and random), logprobs and token_ranking (top tokens)."""
