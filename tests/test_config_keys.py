"""Keys a user reaches with --cfg job are documented or refused: model.dtype_bytes."""

from __future__ import annotations

import pytest

from pipeline.config.checks import ConfigError
from pipeline.config.compose import compose_config
from pipeline.executors import check_config

SPEC = ["executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b"]


@pytest.mark.parametrize("value", [1, 3, 8])
def test_a_dtype_bytes_that_is_no_native_dtype_is_refused_in_one_line(value):
    with pytest.raises(ConfigError) as err:
        check_config(compose_config([*SPEC, f"model.dtype_bytes={value}"]))
    message = str(err.value)
    assert message.startswith(f"model.dtype_bytes={value}:") and "\n" not in message
    assert "quantization" in message


def test_native_dtypes_are_accepted():
    for value in (2, 4):
        check_config(compose_config([*SPEC, f"model.dtype_bytes={value}"]))
