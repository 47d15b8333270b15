"""Why a request ends: the one place that decides it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from stages.request import Request


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

    def reason(self, request: Request) -> str | None:
        """Why the request ends after its latest output token, or None to go on:
        `stop` for an end-of-sequence id or a stop string, `length` for max_new_tokens or
        max_model_len."""
        if not request.ignore_eos and request.output_ids[-1] in self.eos_ids:
            return "stop"
        if len(request.output_ids) >= request.max_new_tokens:
            return "length"
        if request.num_tokens >= self.max_model_len:
            return "length"
        if request.stop and self.decode is not None and self._hit_stop_string(request):
            return "stop"
        return None

    def ended(self, requests: Sequence[Request]) -> list[tuple[int, str]]:
        """(position, reason) of each of a step's requests that ends after its latest
        output token. `reason` decides; it is asked only of the rows that could end now: an
        end-of-sequence id is possible, a stop string is set or a length is reached."""
        eos_possible = bool(self.eos_ids)
        strings = self.decode is not None
        max_model_len = self.max_model_len
        maybe = [
            i
            for i, r in enumerate(requests)
            if (eos_possible and not r.ignore_eos)
            or (strings and r.stop)
            or len(r.output_ids) >= r.max_new_tokens
            or r.num_prompt_tokens + len(r.output_ids) >= max_model_len
        ]
        return [(i, reason) for i in maybe if (reason := self.reason(requests[i]))]

    def _hit_stop_string(self, request: Request) -> bool:
        # Decoding only a tail long enough for the longest stop string keeps this cheap.
        tail = self.decode(request.output_ids[-4 * max(map(len, request.stop)) :])
        return any(s in tail for s in request.stop)
