"""Why a request ends: the one place that decides it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from stages.scheduling.request import FinishReason, Request


class StopRule:
    """End-of-sequence ids, the context limit and the detokenizer that stop strings need.

    A plain class, not a dataclass: Hydra would turn a dataclass passed to a stage's
    constructor into a config node."""

    def __init__(
        self,
        eos_ids: Iterable[int],
        max_model_len: int,
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        self.eos_ids = frozenset(eos_ids)
        self.max_model_len = max_model_len
        self.decode = decode

    def reason(self, request: Request) -> FinishReason | None:
        """Why the request ends after its latest output token, or None to go on:
        `stop` for an end-of-sequence id or a stop string, `length` for max_new_tokens or
        max_model_len."""
        if not request.ignore_eos and request.output_ids[-1] in self.eos_ids:
            return FinishReason.STOP
        if len(request.output_ids) >= request.max_new_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        if request.stop and self.decode is not None and self._hit_stop_string(request):
            return FinishReason.STOP
        return None

    def length_limit(self, request: Request) -> int:
        """The num_tokens at which `length` ends the request."""
        return min(request.num_prompt_tokens + request.max_new_tokens, self.max_model_len)

    def checks_each_token(self, request: Request) -> bool:
        """Whether an end-of-sequence id or a stop string could end the request at any
        token; if not, only reaching length_limit can (what lets a step's rows be checked
        by numbers alone)."""
        eos = bool(self.eos_ids) and not request.ignore_eos
        return eos or (self.decode is not None and bool(request.stop))

    def _hit_stop_string(self, request: Request) -> bool:
        # Decoding only a tail long enough for the longest stop string keeps this cheap.
        tail = self.decode(request.output_ids[-4 * max(map(len, request.stop)) :])
        return any(s in tail for s in request.stop)
