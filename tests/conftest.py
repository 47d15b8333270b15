"""Fixtures shared by the tests; the helpers they use are in tests/helpers.py."""

from __future__ import annotations

import pytest

from tests.helpers import (  # noqa: F401  (tests written before tests/helpers.py import these here)
    LIMITS,
    REPO,
    SMALL,
    TINY,
    make_config,
    run_cli,
    serve,
)


@pytest.fixture(scope="session")
def reference_run():
    """The oracle: dense attention, whole prompts, no chunking."""
    return serve(["attention=reference", "scheduler=whole", "max_tokens=4096"], record_logits=True)


# The peer libraries are optional (the `peer` extra) and take seconds to import: only the
# tests that use them import them, so a worker that runs none of those never pays for them.
@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch", reason="optional: the `peer` extra (PyTorch)")


@pytest.fixture(scope="session")
def transformers(torch):
    return pytest.importorskip("transformers", reason="optional: the `peer` extra (transformers)")
