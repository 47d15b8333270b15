"""A disaggregated deployment under closed-loop load (`workload.concurrency`), with the
semantics of an aggregated run's (pipeline.job.engine.Slots, as `vllm bench serve
--max-concurrency`): at most `concurrency` requests in flight, a request held back sent
when a finished one frees its slot, never before its own arrival, and its latencies
counted from then.

A finish on a decode instance lets the next request into a prefill instance, so the pools
cannot run one after the other: every instance runs side by side on its own virtual
clock, in time order. The instance whose next step starts first runs until it hands a
request on (a first token to the transfer, or a finish back to the client) or its clock
passes the earliest time anything else may happen: another instance's next step, a
transfer's arrival, or the client's next send. Whatever reaches an instance then reaches
it at its next step's start, as a step under way is not interrupted. The router
(pipeline.disagg.routing) picks each request's prefill instance in the order the client
sends them, and its decode instance in the order their KV caches arrive, as in an
open-loop run.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from pipeline.disagg.admission import DecodeAdmission
from pipeline.disagg.routing import Router
from pipeline.executors.fast_forward import FastForward
from pipeline.job.engine import Arrivals, Engine, Slots, long_lived_frozen
from pipeline.job.metrics import StepTotals
from stages.scheduling.request import Request


class Copies(NamedTuple):
    """How a request becomes what each pool's instance gets (pipeline.disagg.deployment):
    its prefill copy, and its decode copy once the prefill copy ended (None: failed)."""

    prefill: Callable[[Request], Request]
    decode: Callable[[Request, Request], Request | None]


class Feed:
    """An instance's requests: each admitted at its arrival (`admit`: False while the
    instance has no room, and it waits in order), never past `horizon` while idle."""

    def __init__(
        self, engine: Engine, admit: Callable[[Request], bool], requests: Sequence[Request] = ()
    ) -> None:
        self.engine = engine
        self.admit = admit
        # not arrived yet, in arrival order
        self.pending: deque[Request] = deque(sorted(requests, key=lambda r: r.arrival_s))
        self.queued: deque[Request] = deque()  # arrived, waiting for room
        self.horizon = math.inf

    def next_event(self) -> float:
        """When this instance next starts a step or takes a request (inf: never unless
        one is handed to it)."""
        if self.engine.scheduler.has_work or self.queued:
            return self.engine.clock()
        if self.pending:
            return max(self.engine.clock(), self.pending[0].arrival_s)
        return math.inf

    def next_arrival(self) -> float:
        """When one may next be admitted while none finishes: never while one waits for
        room (only a finish makes it), else at the next arrival."""
        return math.inf if self.queued or not self.pending else self.pending[0].arrival_s

    def finishes_before_change(self) -> float:
        return 0 if self.queued else math.inf

    def hand(self, request: Request, ended: Callable[[Request], None]) -> None:
        """The request to this instance, or ended at once (`ended`) where it can never be
        served here (its length, its sampling values)."""
        reason = self.engine.rejection(request)
        if reason:
            request.fail(reason, request.arrival_s)
            ended(request)
        else:
            self.pending.append(request)

    def take(self, now: float, idle: bool) -> Arrivals | None:
        clock, pending = self.engine.clock, self.pending
        if idle and not self.queued:
            if not pending or pending[0].arrival_s > self.horizon:
                return None  # nothing before what others may hand in: run them first
            clock.sleep_until(pending[0].arrival_s)
            now = clock()
        while pending and pending[0].arrival_s <= now:
            self.queued.append(pending.popleft())
        while self.queued and self.admit(self.queued[0]):
            self.queued.popleft()
        if idle and self.queued and not self.engine.scheduler.has_work:  # it can never fit
            r = self.queued.popleft()
            r.fail("the decode instance's KV pool cannot hold the prompt: raise num_blocks", now)
        return Arrivals([])


class Handed:
    """The stop hook of one instance's turn: it ends once the instance handed a request
    on, or its clock passed the turn's horizon (a step starting at the horizon runs)."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self.done = False

    def __call__(self, now: float) -> bool:
        return self.done or now > self.horizon

    def next_change(self) -> float:
        return self.horizon

    def finishes_before_change(self) -> float:
        return 0


def added(scheduler_add: Callable[[Request], None]) -> Callable[[Request], bool]:
    """A prefill instance's admission: its scheduler queues every request."""

    def admit(request: Request) -> bool:
        scheduler_add(request)
        return True

    return admit


class ClosedLoop:
    """The client, the instances and the transfers in flight of one closed-loop run (0
    concurrency: an open loop served side by side). `pulls`: the seconds of the pulls
    decode instances make themselves, by the decode copy's seq_id; `routers`: each pool's."""

    def __init__(
        self,
        pools: tuple[Sequence[Engine], Sequence[Engine]],
        requests: Sequence[Request],
        concurrency: int,
        copies: Copies,
        totals: StepTotals,
        pulls: Mapping[int, float],
        routers: tuple[Router, Router],
    ) -> None:
        self.copies, self.totals, self.routers = copies, totals, routers
        self.requests = list(requests)  # in the order serve() answers in
        self.waiting = deque(sorted(requests, key=lambda r: r.arrival_s))
        self.slots = Slots(concurrency)
        self.prefill = [Feed(e, added(e.scheduler.add)) for e in pools[0]]
        self.decode = [Feed(e, DecodeAdmission(e.scheduler, e.clock, pulls)) for e in pools[1]]
        self.in_flight: list[tuple[float, int, Request]] = []  # transfers, by arrival
        self.firsts: dict[int, Request] = {}  # prefill copies, by the request's seq_id
        self.rests: dict[int, Request | None] = {}
        self.originals: dict[int, Request] = {}  # each prefill copy's request, by its seq_id
        self.at: dict[int, int] = {}  # each copy's instance in its pool, by its seq_id
        self.handed: Handed | None = None

    def next_send(self) -> float:
        if not self.waiting or not self.slots.free:
            return math.inf
        return max(self.waiting[0].arrival_s, self.slots.next_open)

    def send(self) -> None:
        """The client's next request, into the next prefill instance."""
        r = self.slots.take(self.waiting.popleft())
        first = self.copies.prefill(r)
        self.firsts[r.seq_id] = first
        self.originals[first.seq_id] = r
        self.at[first.seq_id] = i = self.routers[0].pick(first)
        self.prefill[i].hand(first, self.prefilled)

    def prefilled(self, first: Request) -> None:
        """A prefill copy ended: its KV cache on its way, or the request failed."""
        self.routers[0].finished(self.at.pop(first.seq_id))
        original = self.originals[first.seq_id]
        rest = self.copies.decode(original, first)
        if rest is None:
            self.rests[original.seq_id] = None
            self.slots.give_back(first.finish_s if first.finish_s is not None else 0.0)
        else:
            heapq.heappush(self.in_flight, (rest.arrival_s, original.seq_id, rest))
        self._hand_on()

    def decoded(self, rest: Request) -> None:
        self.routers[1].finished(self.at.pop(rest.seq_id))
        self.slots.give_back(rest.finish_s if rest.finish_s is not None else 0.0)
        self._hand_on()

    def _hand_on(self) -> None:
        if self.handed is not None:
            self.handed.done = True

    def arrive(self) -> None:
        """The earliest transfer in flight reaches the next decode instance."""
        _, seq_id, rest = heapq.heappop(self.in_flight)
        self.rests[seq_id] = rest
        self.at[rest.seq_id] = i = self.routers[1].pick(rest)
        self.decode[i].hand(rest, self.decoded)

    def run(self) -> float:
        """Serves every request; returns when the last instance finished."""
        feeds = [*self.prefill, *self.decode]
        for feed in feeds:
            feed.engine.clock.restart()
        while True:
            times = [feed.next_event() for feed in feeds]
            send = self.next_send()
            arrival = self.in_flight[0][0] if self.in_flight else math.inf
            t = min(send, arrival, *times)
            if t == math.inf:
                break
            if send == t:  # the client and the transfers first: a step at t sees them
                self.send()
            elif arrival == t:
                self.arrive()
            else:
                i = times.index(t)
                others = (time for j, time in enumerate(times) if j != i)
                self.turn(feeds[i], min(send, arrival, *others))
        return max(feed.engine.now() for feed in feeds)

    def turn(self, feed: Feed, horizon: float) -> None:
        """One instance runs until it hands a request on or passes `horizon`."""
        feed.horizon = horizon
        self.handed = Handed(horizon)
        engine = feed.engine
        on_finish = self.prefilled if feed in self.prefill else self.decoded
        fast_forward = None
        if engine.simulation is not None:  # runs of decode steps, none past the horizon
            fast_forward = FastForward(
                engine,
                lambda: min(feed.next_arrival(), horizon),
                lambda: 0,
                self.totals.add_run,
            )
        engine.loop(feed, self.totals.add, on_finish, stop=self.handed, advance=fast_forward)

    def serve(self) -> tuple[list[Request], list[Request | None], float]:
        """Serves every request; each one's prefill copy and decode copy (None: it ended on
        the prefill instance), in the requests' order, and the run's end."""
        with long_lived_frozen():
            end = self.run()
        firsts = [self.firsts[r.seq_id] for r in self.requests]
        return firsts, [self.rests.get(r.seq_id) for r in self.requests], end
