"""`python -m pipeline.buckets`: the command itself is pipeline/buckets/__init__.py."""

import sys

from pipeline.buckets import COMMAND

sys.exit(COMMAND.main())
