"""`python -m pipeline.deploy`: the command itself is pipeline/deploy/__init__.py."""

import sys

from pipeline.deploy import COMMAND

sys.exit(COMMAND.main())
