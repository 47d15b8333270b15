"""`python -m pipeline.plan`: the command itself is pipeline/plan/__init__.py."""

from pipeline.plan import COMMAND

COMMAND.main()
