"""Package discovery: every package under pipeline/ and stages/ is found, so a new one can
never be left out, plus conf/ installed as pipeline.conf (pyproject.toml's `packages` takes a
list or a find directive, not a find directive and a mapped package beside it)."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["pipeline*", "stages*"]), "pipeline.conf"])
