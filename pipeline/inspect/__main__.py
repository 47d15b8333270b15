"""`python -m pipeline.inspect`: the command itself is pipeline/inspect/__init__.py."""

import sys

from pipeline.inspect import COMMAND

sys.exit(COMMAND.main())
