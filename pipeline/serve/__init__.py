"""`python -m pipeline.serve`: the engine behind an OpenAI-compatible HTTP server.

The engine loop runs in its own thread (`worker`), fed requests between steps; the HTTP
side (`api`) runs on asyncio and streams each step's tokens as the step finishes.
"""
