"""Schedulers that never split a prompt: the baselines chunked prefill is measured against.

`WholeScheduler` is continuous batching with whole-prompt prefills; `StaticScheduler` is
static batching. Both are the chunked scheduler with a whole-prompt chunk policy.
"""

from __future__ import annotations

from stages.scheduling.scheduler import ChunkedScheduler


class WholeScheduler(ChunkedScheduler):
    """Prefills every prompt in one step: the baseline that chunked prefill is measured against."""

    splits_prompts = False

    def __init__(self, **kwargs) -> None:
        super().__init__(align_chunks=False, long_prefill_threshold=0, **kwargs)


class StaticScheduler(WholeScheduler):
    """Static batching, as `generate()`, Optimum Habana's run_generation.py and TGI-style
    servers batch: a batch of up to `max_num_seqs` waiting requests (as many as the step's
    budget prefills whole, and whose prompts and outputs the KV pool holds to the end, so
    none is ever preempted) is prefilled in one step and decoded in lockstep; nothing new
    is admitted until every request of the batch has finished. A request that finishes
    early leaves the batch (its row is not computed on as padding). Prompts are padded to
    the batch's longest, whatever `max_padding` says, as a static batch is."""

    static_batches = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**{**kwargs, "max_padding": 1.0})
