"""How a decode instance takes in a request whose KV cache was computed on a prefill
instance, by its engine's path (stages.simulator.disagg_engines): where the engine pulls
the KV cache inside a step of its own, the instance stops for the pull first (its running
requests wait); where the prefill instance's token is carried over, the client gets it
once the instance has taken the request in."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.job.clock import Clock
from stages.interfaces import Scheduler
from stages.scheduling.request import Request


class DecodeAdmission:
    """A decode instance's admission of arrived requests: `pulls` holds the seconds of the
    pulls it makes itself, by the request's seq_id (none where the pull runs beside its
    steps)."""

    def __init__(self, scheduler: Scheduler, clock: Clock, pulls: Mapping[int, float]) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.pulls = pulls

    def __call__(self, request: Request) -> bool:
        """Takes the request in if max_num_seqs and the KV pool have room (False: not)."""
        if not self.scheduler.admit_computed(request):
            return False
        pull = self.pulls.get(request.seq_id, 0.0)
        if pull:
            self.clock.sleep_until(self.clock() + pull)
        if request.output_ids and not request.token_times:  # the carried first token
            request.token_times.append(self.clock())
        return True
