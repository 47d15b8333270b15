"""Workloads: the requests a run serves, with their arrival times.

Each kind in a module of its own (synthetic and mixed, multi-turn chats, jsonl files; traces
in stages/trace/); configs name them here, as `stages.workload.SyntheticWorkload`.
"""

from __future__ import annotations

from stages.workload.arrivals import MAX_ARRIVAL_S, bound_arrivals, closed_loop, poisson_arrivals
from stages.workload.jsonl import JsonlWorkload
from stages.workload.multi_turn import MultiTurnWorkload
from stages.workload.synthetic import MixedWorkload, SyntheticWorkload

# The names configs' `_target_`s and other modules use.
__all__ = [
    "MAX_ARRIVAL_S",
    "JsonlWorkload",
    "MixedWorkload",
    "MultiTurnWorkload",
    "SyntheticWorkload",
    "bound_arrivals",
    "closed_loop",
    "poisson_arrivals",
]
