"""The step loop: schedule, build metadata, run the model, sample, update."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

import structlog

from pipeline.metrics import StepRecord
from stages.metadata import ForwardMeta
from stages.request import Request, StepPlan

log = structlog.get_logger(__name__)


class Engine:
    def __init__(self, tokenizer, scheduler, metadata, model, attention, sampler) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.metadata = metadata
        self.model = model
        self.attention = attention
        self.sampler = sampler

    def warmup(self) -> float:
        """Runs every prepared bucket shape once, as the HPU compiles them before serving."""
        start = time.perf_counter()
        phases = self.metadata.warmup_shapes(mixed=self.scheduler.chunked)
        for phase, shapes in phases.items():
            t = time.perf_counter()
            for prefill, decode in shapes:
                self.model.forward(self.metadata.dummy(prefill, decode), self.attention)
            log.info(
                "warmup_phase",
                phase=phase,
                shapes=len(shapes),
                seconds=round(time.perf_counter() - t, 3),
            )
        return time.perf_counter() - start

    def reject_invalid(self, requests: Sequence[Request]) -> None:
        """A request that can never be served ends now with its reason; the others go on."""
        for r in requests:
            if not r.finished:
                reason = self.scheduler.rejection(r) or self.sampler.validate_request(r)
                if reason:
                    r.fail(reason, r.arrival_s)

    def step(self, plan: StepPlan, now: Callable[[], float]) -> ForwardMeta:
        meta = self.metadata.build(plan)
        logits = self.model.forward(meta, self.attention)
        samples = self.sampler.sample(logits, plan.sampled_requests)
        t = now()
        sampled = self.scheduler.update(plan, samples.token_ids, t)
        if samples.logprobs is not None:
            rows = {id(r): i for i, r in enumerate(plan.sampled_requests)}
            for r in sampled:
                r.logprobs.append(samples.logprobs[rows[id(r)]])
        for r in sampled:
            if r.stop and not r.finished and self._hit_stop(r):
                self.scheduler.finish(r, "stop", t)
        return meta

    def _hit_stop(self, r: Request) -> bool:
        # Decoding only a tail long enough for the longest stop string keeps this cheap.
        tail = self.tokenizer.decode(r.output_ids[-4 * max(map(len, r.stop)) :])
        return any(s in tail for s in r.stop)

    def run(
        self,
        requests: Sequence[Request],
        on_step: Callable[[StepRecord], None] = lambda record: None,
        on_finish: Callable[[Request], None] = lambda request: None,
    ) -> float:
        """Serves every request to its end; returns the wall time in seconds."""
        start = time.perf_counter()

        def now() -> float:
            return time.perf_counter() - start

        self.reject_invalid(requests)
        for r in requests:
            if r.finished:
                on_finish(r)
        pending = deque(sorted((r for r in requests if not r.finished), key=lambda r: r.arrival_s))
        step = 0
        while pending or self.scheduler.has_work:
            t = now()
            while pending and pending[0].arrival_s <= t:
                self.scheduler.add(pending.popleft())
            if not self.scheduler.has_work:
                time.sleep(max(0.0, pending[0].arrival_s - t))  # idle until the next arrival
                continue
            plan = self.scheduler.schedule(t)
            for r in plan.failed:
                on_finish(r)
            if plan.empty:
                if plan.failed:
                    continue
                raise RuntimeError("the scheduler found nothing to run while requests wait")
            meta = self.step(plan, now)
            for r in plan.sampled_requests:
                if r.finished:
                    self.attention.release(r.id)
                    on_finish(r)
            on_step(
                StepRecord(
                    step=step,
                    mode=plan.mode,
                    prefill=[
                        {"id": c.request.id, "start": c.start, "end": c.end} for c in plan.prefill
                    ],
                    decode=[r.id for r in plan.decode],
                    preempted=[r.id for r in plan.preempted],
                    num_tokens=plan.num_tokens,
                    padded_tokens=meta.padded_tokens,
                    bucket=meta.bucket,
                    duration_s=now() - t,
                )
            )
            step += 1
        return now()
