"""`python -m pipeline.summary`: the command itself is pipeline/summary/__init__.py."""

import sys

from pipeline.summary import COMMAND

sys.exit(COMMAND.main())
