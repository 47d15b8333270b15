"""The KV transfer of prefill/decode disaggregation: a prompt's keys and values, computed on
a prefill instance, sent to the decode instance that generates the rest.

Each of the prefill instance's `tp` devices holds its share of every layer's KV heads and
sends it over its own link, the shares in parallel:

    seconds = prompt tokens x KV bytes per token and device (at the prefill tp, in the
              KV cache's precision) / link bytes per second + the transfer's fixed time

The link is the device profile's `kv_link_gbs` (scale-out bandwidth a direction per
device, cited in conf/hardware/) and `kv_link_latency_s`, unless `disagg.link_gbps` /
`disagg.transfer_latency_s` set them.
"""

from __future__ import annotations

from dataclasses import dataclass

from stages.model.spec import ModelSpec
from stages.simulator.hardware import HardwareProfile
from stages.simulator.precision import Precision


@dataclass(frozen=True)
class KvLink:
    """One instance's KV transfer: bytes of a prompt token's KV per device, the link's
    bandwidth per device and a transfer's fixed time."""

    bytes_per_token: float  # KV of one token on one device of the sending instance
    bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(
                f"disagg.link_gbps: the KV link has {self.bytes_per_s / 1e9:g} GB/s; give "
                "disagg.link_gbps=50 (or a hardware profile with kv_link_gbs)"
            )
        if not self.latency_s >= 0:
            raise ValueError(f"disagg.transfer_latency_s={self.latency_s}: must be >= 0")

    def seconds(self, tokens: int) -> float:
        """Time to send the KV of `tokens` prompt tokens."""
        return tokens * self.bytes_per_token / self.bytes_per_s + self.latency_s


def kv_bytes_per_token(spec: ModelSpec, precision: Precision, tp: int) -> float:
    """Keys and values of one token in every layer on one of `tp` devices, in the KV
    cache's precision (what the cost model reads per cached slot)."""
    return spec.kv_bytes_per_token(tp) * precision.kv_bytes(spec.dtype_bytes) / spec.dtype_bytes


def kv_link(
    spec: ModelSpec,
    hardware: HardwareProfile,
    precision: Precision,
    tp: int,
    link_gbps: float = 0.0,
    latency_s: float = -1.0,
) -> KvLink:
    """The link of a prefill instance at `tp`: `link_gbps` (GB/s a direction per device)
    and `latency_s` where given (> 0, >= 0), else the device profile's."""
    gbs = link_gbps if link_gbps > 0 else hardware.kv_link_gbs
    latency = latency_s if latency_s >= 0 else hardware.kv_link_latency_s
    return KvLink(kv_bytes_per_token(spec, precision, tp), gbs * 1e9, latency)
