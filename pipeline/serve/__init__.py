"""`python -m pipeline.serve`: the engine behind an OpenAI-compatible HTTP server.

The engine loop runs in its own thread (`worker`), fed requests between steps; the HTTP
side (`api`) runs on asyncio and streams each step's tokens as the step finishes.
"""

import signal
import sys

# `python -m pipeline.serve` (the package is imported while sys.argv[0] is still "-m"):
# stop signals wait until the command's own handlers are in place (__main__), since the
# imports load Paddle, whose handlers would end the process with a C++ stack.
if sys.argv[:1] == ["-m"]:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
