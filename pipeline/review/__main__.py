"""`python -m pipeline.review`: the command itself is pipeline/review/__init__.py."""

import sys

from pipeline.review import COMMAND

sys.exit(COMMAND.main())
