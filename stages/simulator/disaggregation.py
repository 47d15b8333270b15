"""The KV transfer of prefill/decode disaggregation: a prompt's keys and values, computed on
a prefill instance, pulled by the decode instance that generates the rest.

A transfer moves pages, not one buffer: the engines' connectors (vLLM's NixlConnector,
SGLang's and TensorRT-LLM's transfer backends) post one descriptor per KV block of each
layer, keys and values apart, and each descriptor costs its posting and completion
whatever its size (the per-piece time). The devices of each side move their shares in
parallel, so a transfer takes its busiest link's time:

    seconds = bytes on the busiest link / link bytes per second
              + pieces one receiving device posts x the per-piece time
              + the transfer's fixed time

- bytes: prompt tokens x KV bytes per token and device at the smaller of the two tps (in
  the KV cache's precision): a wider decode pool pulls slices of each prefill device's
  heads, a narrower one pulls several prefill devices' heads into one device;
- pieces: ceil(tokens / block_size) blocks x layers x 2 (keys, values), times
  prefill_tp / decode_tp where a decode device gathers several prefill devices' heads
  (vLLM's heterogeneous-TP reads: one descriptor per block and remote rank); an engine
  that packs a request's keys and values into one tensor each (stages.simulator.
  disagg_engines) moves 2 pieces per source device.

The link is the device profile's `kv_link_gbs`, `kv_link_latency_s` and
`kv_link_piece_s` (each cited in conf/hardware/), unless `disagg.link_gbps`,
`disagg.transfer_latency_s` or `disagg.transfer_piece_s` set them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stages.model.spec import ModelSpec
from stages.simulator.hardware import HardwareProfile
from stages.simulator.precision import Precision


@dataclass(frozen=True)
class KvLayout:
    """How a prompt's KV cache is cut into pieces: pages of `block_size` tokens in each of
    `layers` layers, keys and values apart, read by a decode device from
    `sources` prefill devices."""

    block_size: int
    layers: int
    sources: int = 1  # prefill devices one decode device reads from
    paged: bool = True  # a piece per block of each layer; False: keys and values packed

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.layers < 1 or self.sources < 1:
            raise ValueError(
                f"a KV layout of block_size={self.block_size}, {self.layers} layers and "
                f"{self.sources} sources: each must be >= 1"
            )

    def pieces(self, tokens: int) -> int:
        """Descriptors one decode device posts to pull the KV of `tokens` tokens."""
        per_source = math.ceil(tokens / self.block_size) * self.layers if self.paged else 1
        return per_source * 2 * self.sources


@dataclass(frozen=True)
class KvLink:
    """One transfer's cost: KV bytes of a prompt token on the busiest link, the link's
    bandwidth, a transfer's fixed time, each piece's time and the layout that counts them."""

    bytes_per_token: float
    bytes_per_s: float
    latency_s: float
    piece_s: float = 0.0
    layout: KvLayout = KvLayout(block_size=1, layers=1)

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(
                f"disagg.link_gbps: the KV link has {self.bytes_per_s / 1e9:g} GB/s; give "
                "disagg.link_gbps=50 (or a hardware profile with kv_link_gbs)"
            )
        if not self.latency_s >= 0:
            raise ValueError(f"disagg.transfer_latency_s={self.latency_s}: must be >= 0")
        if not self.piece_s >= 0:
            raise ValueError(f"disagg.transfer_piece_s={self.piece_s}: must be >= 0")

    def seconds(self, tokens: int) -> float:
        """Time to pull the KV of `tokens` prompt tokens."""
        return (
            tokens * self.bytes_per_token / self.bytes_per_s
            + self.layout.pieces(tokens) * self.piece_s
            + self.latency_s
        )


def kv_bytes_per_token(spec: ModelSpec, precision: Precision, tp: int) -> float:
    """Keys and values of one token in every layer on one of `tp` devices, in the KV
    cache's precision (what the cost model reads per cached slot)."""
    return spec.kv_bytes_per_token(tp) * precision.kv_bytes(spec.dtype_bytes) / spec.dtype_bytes


@dataclass(frozen=True)
class LinkSettings:
    """A run's overrides of the profile's link (`disagg.*`): GB/s a direction per device
    (> 0), a transfer's fixed time and a piece's time (each >= 0); the others mean the
    profile's figure."""

    link_gbps: float = 0.0
    latency_s: float = -1.0
    piece_s: float = -1.0


def kv_link(
    spec: ModelSpec,
    hardware: HardwareProfile,
    precision: Precision,
    tps: tuple[int, int],
    block_size: int,
    settings: LinkSettings = LinkSettings(),
    paged: bool = True,
) -> KvLink:
    """The link between a prefill pool and a decode pool at tps (prefill, decode); paged:
    a piece per block of each layer, else keys and values packed."""
    prefill_tp, decode_tp = tps
    gbs = settings.link_gbps if settings.link_gbps > 0 else hardware.kv_link_gbs
    latency = settings.latency_s if settings.latency_s >= 0 else hardware.kv_link_latency_s
    piece = settings.piece_s if settings.piece_s >= 0 else hardware.kv_link_piece_s
    layout = KvLayout(block_size, spec.num_layers, max(1, prefill_tp // decode_tp), paged)
    per_token = kv_bytes_per_token(spec, precision, min(prefill_tp, decode_tp))
    return KvLink(per_token, gbs * 1e9, latency, piece, layout)
