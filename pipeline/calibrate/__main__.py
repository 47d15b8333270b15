"""`python -m pipeline.calibrate`: the command itself is pipeline/calibrate/__init__.py."""

import sys

from pipeline.calibrate import main
from pipeline.schema import register_schemas

if "--published" in sys.argv[1:]:  # fit a device profile to published figures
    from pipeline.calibrate.fit import main as fit_published

    sys.exit(fit_published(sys.argv[1:]))
register_schemas()
main()
