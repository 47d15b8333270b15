"""What each stage offers the engine: the contracts `pipeline.engine.Engine` is typed against.

A stage is any object with these methods; Hydra builds it from its group's config. The
attention backends' kernels have their own contract, `stages.attention.interface.AttentionOps`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from stages.metadata import ForwardMeta
from stages.request import Request, Samples, StepPlan

if TYPE_CHECKING:  # annotations only: a simulated run never imports Paddle
    import paddle


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    chat_template: str | None  # a Jinja chat template, where the tokenizer's files carry one

    @property
    def eos_ids(self) -> frozenset[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[int]]:
        """Chat messages as prompt text under the model's chat template (stages/chat.py's
        plain one where it has none), and its ids; ValueError for a malformed message."""


class Scheduler(Protocol):
    """Chooses each step's work under the budget; advances requests after the forward."""

    splits_prompts: bool  # chunked prefill: steps mix a prompt's chunk with decodes
    padded_budget: bool  # the budget bounds a step's prefill rows x padded width

    def rejection(self, request: Request) -> str | None:
        """Why the request can never be served under the current limits, or None."""

    def add(self, request: Request) -> None:
        """An arrived request joins the waiting queue."""

    @property
    def has_work(self) -> bool: ...

    def schedule(self, now: float) -> StepPlan:
        """The next step: prefill chunks and decodes; preempted and failed requests."""

    def update(self, plan: StepPlan, samples: Samples, now: float) -> list[Request]:
        """Keeps the step's samples and ends requests that stop; returns those."""

    def abort(self, request: Request, message: str, now: float) -> None:
        """Ends a waiting or running request with an error; its KV blocks are freed now."""


class MetadataBuilder(Protocol):
    """Lays a step plan out in the padded, bucketed shapes the device runs."""

    bucket_misses: int

    def build(self, plan: StepPlan) -> ForwardMeta: ...

    def dummy(
        self, prefill: tuple[int, int, int] | None, decode: tuple[int, int] | None
    ) -> ForwardMeta:
        """A step of the given bucket shapes made only of padding (warmup)."""

    def warmup_shapes(self, mixed: bool, padded_budget: bool = True) -> dict[str, list[tuple]]:
        """Every shape a step can pad to, by phase (prefill, decode, mixed)."""

    max_warmup_shapes: int  # warmup refuses a larger set; 0 = no limit

    def warmup_counts(self, mixed: bool, padded_budget: bool = True) -> dict[str, int]:
        """The graphs each phase of warmup_shapes compiles, counted without listing them."""


class Attention(Protocol):
    """Owns the KV cache tensors and the per-step state every layer shares."""

    def load_weights(self, model: Model) -> None:
        """Puts each layer's QKV weight into the backend's layout, once."""

    def prepare(self, meta: ForwardMeta, cos: paddle.Tensor, sin: paddle.Tensor) -> Any:
        """The state one forward's layers share (rotary table, write slots, decode layout)."""

    def qkv_rope(
        self, layer: int, x: paddle.Tensor, state: Any
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """The layer's QKV projection of x with rotary positions: q, k, v."""

    def attend(
        self,
        layer: int,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        state: Any,
        out_weight: paddle.Tensor,
    ) -> paddle.Tensor:
        """Writes k, v to the cache and attends, through the output projection."""

    def release(self, request: Request) -> None:
        """Drops whatever the stage holds for a finished request."""


class Model(Protocol):
    dtype: str

    @property
    def num_parameters(self) -> int: ...

    def forward(self, meta: ForwardMeta, attention: Attention) -> paddle.Tensor:
        """Logits [rows, vocab] for meta.logits_rows."""


class Sampler(Protocol):
    def validate_request(self, request: Request) -> str | None:
        """Why the request's own sampling values are invalid, or None."""

    def sample(self, logits: paddle.Tensor, requests: Sequence[Request]) -> Samples: ...
