"""Admission: which waiting requests a step takes in, and the order a step serves its
rows in (StepOrder), for the continuous-batching schedulers (stages.scheduling.scheduler)."""

from __future__ import annotations

import enum
from collections import deque

from stages.scheduling.chunk_policy import ChunkPolicy, StepBudget
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import PrefillChunk, Request, Status, StepPlan
from stages.scheduling.request_table import RequestTable
from stages.scheduling.step_rows import StepRows


class StepOrder(enum.StrEnum):
    """Whose rows a step serves first when prompts wait beside running decodes (members
    named by their values: OmegaConf matches a config value by name)."""

    # the running rows (decodes, next chunks) first, then new prompts, in one mixed step:
    # vLLM V1's `schedule`, FastDeploy's resource_manager_v1, TensorRT-LLM's scheduler
    decode_first = "decode_first"
    # while a prompt waits or is being chunked, a step of prefill chunks alone (no decode
    # rows), then decode steps: SGLang's `get_next_batch_to_run` (without
    # --enable-mixed-chunk, its default)
    prefill_first = "prefill_first"


class Admission:
    """The waiting queue's way into the running table, owned by a scheduler (its policy:
    max_num_seqs, the token budget's chunks, no_evict, and static batches that admit only
    into an empty table). It shares the scheduler's queue and table, never copies them."""

    def __init__(
        self,
        waiting: deque[Request],
        table: RequestTable,
        kv_cache: KVCacheManager,
        chunks: ChunkPolicy,
        limits: tuple[int, int, int],
        no_evict: bool,
        step_order: StepOrder,
        static_batches: bool,
    ) -> None:
        """limits: (max_tokens, max_num_seqs, max_model_len)."""
        self.waiting, self.table, self.kv_cache, self.chunks = waiting, table, kv_cache, chunks
        self.max_tokens, self.max_num_seqs, self.max_model_len = limits
        self.no_evict, self.step_order, self.static_batches = no_evict, step_order, static_batches

    def admit_waiting(self, plan: StepPlan, budget: StepBudget, now: float, rows: StepRows) -> None:
        """First chunks of waiting requests, in order, while the budget, max_num_seqs and
        the cache allow; the first that does not fit ends admission (it never loops). A
        request's first chunk starts after its longest cached prefix."""
        room = self.room()
        while self.waiting and budget.left > 0 and room > 0:
            request = self.waiting[0]
            cached = self.kv_cache.match_prefix(request)
            computed = len(cached) * self.kv_cache.block_size
            remaining = request.num_tokens - computed
            too_long = self.chunks.one_step_error(remaining)
            if too_long:  # only a preempted request gets here: its recompute outgrew a step
                self.waiting.popleft()
                request.fail(f"preempted at {too_long}: raise max_tokens or num_blocks", now)
                plan.failed.append(request)
                continue
            n = self.chunks.length(remaining, budget)
            if n == 0 or not self.kv_cache.allocate_slots(request, n, cached, computed=computed):
                return
            self.waiting.popleft()
            request.status = Status.RUNNING
            if not request.num_preemptions:
                request.cached_tokens = computed
            rows.prefill.append(len(self.table))
            self.table.append(request, computed)
            plan.prefill.append(PrefillChunk(request, computed, computed + n, computed))
            self.chunks.charge(n, budget)
            room -= 1

    def admit_computed(self, request: Request) -> bool:
        """Admits a request whose prompt was computed elsewhere (a disaggregated decode
        instance: its KV cache arrived by transfer) as running: its prompt's blocks are
        taken now. A request with no output yet has its last prompt token computed again
        by its next step, a one-token chunk that samples its first output token (vLLM's
        NixlConnector loads all but the last token's KV and recomputes that one); one that
        has output decodes its next token. False (nothing taken) while max_num_seqs or
        the cache leaves no room."""
        if len(self.table) >= self.max_num_seqs:
            return False
        if self.no_evict:  # the pool must hold it to its end beside the running requests
            total = min(request.num_prompt_tokens + request.max_new_tokens, self.max_model_len)
            if self.kv_cache.blocks_for(total) > self.table.free_to_end():
                return False
        prompt = request.num_prompt_tokens
        if not self.kv_cache.allocate_slots(request, prompt, computed=0):
            return False
        computed = prompt - (0 if request.output_ids else 1)
        request.status = Status.RUNNING
        self.kv_cache.cache_computed_blocks(request, computed)
        self.table.append(request, computed)
        return True

    def room(self) -> int:
        """How many waiting requests this step may admit: up to max_num_seqs running, with
        `no_evict` only as many as the pool holds to their end; a static batch only into an
        empty table, as many as the pool holds to their end."""
        if self.static_batches:
            if len(self.table):
                return 0  # the batch in flight runs to its end first
            return self.table.fitting_to_end(self.waiting, self.max_num_seqs, self.max_model_len)
        room = self.max_num_seqs - len(self.table)
        if not self.no_evict:
            return room
        return self.table.fitting_to_end(self.waiting, room, self.max_model_len)

    def may_admit(self, left: int) -> bool:
        """Whether a step whose decodes leave `left` of the budget could admit the first
        waiting request, now or while the running requests only decode: what holds it
        back (budget, room, a chunk that fits no step, too few free blocks) stays, except
        a cached prefix, which the decodes' full blocks may lengthen."""
        if self.step_order is StepOrder.prefill_first:  # a prefill step takes the whole budget
            left = self.max_tokens
        if not self.waiting or left <= 0 or self.room() <= 0:
            return False
        head = self.waiting[0]
        if self.kv_cache.prefix is not None or self.chunks.one_step_error(head.num_tokens):
            return True
        n = self.chunks.length(head.num_tokens, self.chunks.step_budget(left))
        return n > 0 and self.kv_cache.blocks_for(n) <= self.kv_cache.num_free_blocks
