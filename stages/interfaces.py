"""What each stage offers the engine: the contracts `pipeline.job.engine.Engine` is typed against.

A stage is any object with these methods and attributes; Hydra builds it from its group's
config. Every ability the engine may ask of a stage is declared here, so nothing is probed
with getattr. Abilities only a simulated build asks for (leaps over decode runs, predicted
warmup) are protocols of their own at the end, which the stages that have them implement
and no other stage need answer (as vLLM's `SupportsX` model interfaces). The attention
backends' kernels have their own contract,
`stages.model.attention.interface.AttentionOps`; a prompt's ids made on demand,
`stages.scheduling.request.PromptIds`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from stages.forward.forward_meta import ForwardMeta
from stages.model.spec import ModelSpec
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import DecodeRun, Request, Samples, StepPlan
from stages.scheduling.request_table import RequestTable
from stages.scheduling.step_rows import StepRows

if TYPE_CHECKING:  # annotations only: a simulated run never imports Paddle
    import paddle


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int | None  # None: the tokenizer has none
    chat_template: str | None  # a Jinja chat template, where the tokenizer's files carry one
    # The BOS and EOS tokens' own text, as the files name them ("" where they name none):
    # what the server's /tokenizer_info tells a client that tokenizes through it.
    bos_text: str
    eos_text: str

    @property
    def eos_ids(self) -> frozenset[int]: ...

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of control tokens beside BOS, EOS and PAD (chat markers and the like)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[int]]:
        """Chat messages as prompt text under the model's chat template (stages/loading/chat.py's
        plain one where it has none), and its ids; ValueError for a malformed message."""


class Workload(Protocol):
    """What the engine gets from a workload: its requests, and how many may be in flight at
    once (`workload.concurrency`; 0 = open loop, each request at its own arrival)."""

    concurrency: int

    @property
    def counts(self) -> Mapping[str, Any]:
        """What loading counted, for the run's metrics (a trace's rows read, skipped,
        clipped, rejected); empty for a workload that drops nothing."""

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        """Every request, in workload order, with its arrival time."""


class Scheduler(Protocol):
    """Chooses each step's work under the budget; advances requests after the forward."""

    splits_prompts: bool  # chunked prefill: steps mix a prompt's chunk with decodes
    padded_budget: bool  # the budget bounds a step's prefill rows x padded width
    kv_cache: KVCacheManager  # the block books its admissions and preemptions keep

    @property
    def waiting(self) -> Collection[Request]:
        """Requests not yet admitted."""

    @property
    def running(self) -> Collection[Request]:
        """Requests admitted and not finished (the batch)."""

    def rejection(self, request: Request) -> str | None:
        """Why the request can never be served under the current limits, or None."""

    def add(self, request: Request) -> None:
        """An arrived request joins the waiting queue."""

    def admit_computed(self, request: Request) -> bool:
        """A request whose prompt's KV cache was computed elsewhere joins the running
        requests as a decode, its blocks taken now; False while there is no room."""

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

    @property
    def bucket_misses(self) -> int:
        """Steps whose shape was outside the prepared buckets."""

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
    """What the engine and the build ask of the attention stage: the KV cache's tensors
    are its own, kept until a request ends. A model's layers ask more (LayerAttention)."""

    # Whether requests may share a cached prefix's blocks: a stage that keeps each
    # request's keys apart (the dense oracle) has nothing to share.
    supports_prefix_caching: bool

    def load_weights(self, model: Model[Any]) -> None:
        """Puts each layer's QKV weight into the backend's layout, once."""

    @property
    def packs_rows(self) -> bool:
        """Whether the backend attends a step's real tokens packed, without the padding
        rows: the metadata builder then lays out those alone (ForwardMeta.packed), and the
        model runs its dense layers on them."""

    def release(self, request: Request) -> None:
        """Drops whatever the stage holds for a finished request."""


class LayerAttention(Attention, Protocol):
    """What a model's layers ask of the attention stage: the per-step state they share,
    each layer's QKV with rotary positions, and attention over the KV cache."""

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

    def compiled_decode(self, layer: int, state: Any) -> Any:
        """What the compiled decode layer (stages/model/decode_layer.cc) takes from this
        stage for the layer (stages.model.attention.interface.CompiledDecode), or None
        where the step or the stage does not run it."""


# The attention a model's forward takes: a model that runs layers takes a LayerAttention;
# a simulated device, which runs none, takes any.
AttentionT = TypeVar("AttentionT", bound=Attention, contravariant=True)


class Model(Protocol[AttentionT]):
    spec: ModelSpec  # the one description of the model: sizes, parts, parameters
    dtype: str

    @property
    def num_parameters(self) -> int: ...

    def forward(self, meta: ForwardMeta, attention: AttentionT) -> paddle.Tensor | None:
        """Logits [rows, vocab] for meta.logits_rows (None from a simulated device)."""


class Sampler(Protocol):
    def validate_request(self, request: Request) -> str | None:
        """Why the request's own sampling values are invalid, or None."""

    def sample(self, logits: paddle.Tensor | None, requests: Sequence[Request]) -> Samples: ...


# ---------------------------------------------- abilities only a simulated build asks for
# A device that predicts its steps' times (stages.simulator) lets runs of decode steps be
# done at once; the stages that plan and lay out such runs declare it here, apart from the
# contracts every build holds them to.


class AppliesDecodeRuns(Protocol):
    """A scheduler whose request table a run's planner reads (stages.simulator.
    fast_forward), and which applies a planned run of decode steps at once."""

    table: RequestTable  # the running requests and their numbers
    max_tokens: int  # the step's token budget
    kv_cache: KVCacheManager

    @property
    def waiting(self) -> Collection[Request]:
        """Requests not yet admitted."""

    def may_admit(self, left: int) -> bool:
        """Whether a step whose decodes leave `left` of the budget could admit the first
        waiting request, now or while the running requests only decode."""

    def scheduled_rows(self, plan: StepPlan) -> StepRows | None:
        """Where the plan's requests are among the running rows, while it is the last
        one scheduled and not updated; None otherwise."""

    def apply_decodes(self, run: DecodeRun, token: int, ends: list[float]) -> list[Request]:
        """Does what the run's steps' updates do, each row getting `token` at each step's
        end time while it stays; returns the requests the run finished, in order."""


class PadsDecodeRuns(Protocol):
    """A metadata builder that lays a run of decode steps out in its buckets."""

    def pad_decodes(self, run: DecodeRun, head: ForwardMeta | None = None) -> DecodeRun | None:
        """The run with each step's decode bucket, as many steps as stay within prepared
        buckets; None where the first does not. `head`: the built first step, kept."""


class Simulation(Protocol):
    """What a simulated build adds to the engine (stages.simulator.simulation): its device
    predicts each step's time on a virtual clock, so warmup is predicted rather than run,
    and runs of decode steps are done at once (leaps)."""

    @property
    def serving_compiles(self) -> int:
        """Graphs compiled while serving so far (predicted)."""

    def predict_warmup(self, phases: Mapping[str, Sequence[tuple]]) -> float:
        """Warmup's predicted seconds for these shapes, each compiled from now on."""

    def leap(
        self,
        until: Callable[[], float],
        finishes: float = 0,
        head: tuple[StepPlan, ForwardMeta] | None = None,
    ) -> tuple[DecodeRun, list[Request]] | None:
        """Where the next steps can only decode the running requests, does as many at once
        as start before `until()`, letting up to `finishes` requests finish before the
        last: what they would do one by one. `head`: a step scheduled and built, not run,
        that the run starts with. Returns the run and the requests it finished; None where
        the next step runs alone."""

    def metrics(self, warmup_shapes: int) -> dict[str, Any]:
        """What the run's metrics add: the device, warmup's predicted seconds for
        `warmup_shapes` graphs, and the compiles while serving."""
