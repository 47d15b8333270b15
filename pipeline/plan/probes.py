"""The capacity search's values: the load axis it scales and each probe's verdict."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadAxis:
    """What the search scales: `key` set to `value(load)`; loads are integers for
    concurrency. `unit` names the load in the reports."""

    key: str
    start: float
    integer: bool
    unit: str
    base: float = 1.0  # time_scale: the scale the user gave, divided by the speed-up

    def value(self, load: float) -> float | int:
        # a plain float: a numpy one (a cost model's estimate) fails the config's validation
        if self.key == "workload.time_scale":
            return float(self.base / load)
        return int(load) if self.integer else float(load)


@dataclass
class Probe:
    load: float
    met: bool
    attainment: float | None
    goodput: float
    offered_rps: float | None
    status: str
    folder: str
    refused: int = 0  # requests the configuration refuses at any load
