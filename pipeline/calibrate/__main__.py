"""`python -m pipeline.calibrate`: the command itself is pipeline/calibrate/__init__.py."""

import sys

from pipeline.calibrate import COMMAND

sys.exit(COMMAND.main())
