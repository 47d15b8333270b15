"""Device profiles read from a file: the `hardware=measured` option's target."""

from __future__ import annotations

from pipeline.schema.hardware import HardwareConf, schema_defaults
from stages.simulator.hardware import HardwareProfile, read_profile


def measured_profile(path: str) -> HardwareProfile:
    """`hardware=measured`: a profile YAML, whose fields the device schema gives a default
    (kv_headroom, fp8_tflops, ...) may be left out."""
    return read_profile(path, schema_defaults(HardwareConf))
