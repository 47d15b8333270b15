"""The lines of a run folder's JSON-lines files, one typed record per kind: steps.jsonl's
StepRecord and generations.jsonl's GenerationRecord. A record's fields are what its line
holds; each field's metadata says what a line read back must hold there, so the writer and
the reader (review, summary, resume, buckets) share one declaration. A line that does not
hold it is a RunFileError naming the place, the field and what it must be.
"""

from __future__ import annotations

import enum
import functools
import math
import operator
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from pipeline.job.metrics import e2e_s, itl_s, ttft_s
from pipeline.run_folder.run_files import RunFileError
from stages.scheduling.request import FinishReason, Request, StepMode, StepPlan

if TYPE_CHECKING:  # the review and summary commands read runs without importing Paddle
    from stages.forward.forward_meta import ForwardMeta
    from stages.forward.step_shape import StepShape

Check = Callable[[Any], bool]
_ID = operator.attrgetter("id")


# ------------------------------------------------------------------ what a field must hold


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _int(value) and value >= 0


def non_negative(value: Any) -> bool:
    """A finite number >= 0 (a boolean is no number)."""
    return (_int(value) or isinstance(value, float)) and math.isfinite(value) and value >= 0


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _list_of(check: Check) -> Check:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _one_of(kind: type[enum.StrEnum]) -> Check:
    values = frozenset(member.value for member in kind)
    return lambda value: isinstance(value, str) and value in values


def _choices(kind: type[enum.StrEnum]) -> str:
    return "one of " + ", ".join(member.value for member in kind)


def _chunk(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _str(value.get("id"))
        and all(_count(value.get(k)) for k in ("start", "end", "cached"))
    )


def _logprob_entry(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    )


def _part_dims(value: Any) -> bool:
    return isinstance(value, dict) and all(_list_of(_count)(x) for x in value.values())


def must(check: Check, text: str, required: bool = True) -> Mapping[str, Any]:
    """A field's metadata: what a line read back must hold there (`text` says it to the
    user), and whether a line may leave the field out."""
    return {"check": check, "must": text, "required": required}


def check_field(value: Any, check: Check, text: str, where: Any, key: str) -> None:
    """RunFileError, naming the place and the field, unless `check(value)`."""
    if not check(value):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise RunFileError(f"{where}: field `{key}` is {shown}, which must be {text}")


def json_kind(value: Any) -> str:
    """A JSON value's kind, as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {list: "a list", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


# ------------------------------------------------------------------------------ records


_Checks = tuple[tuple[str, Check, str], ...]


@functools.cache
def _spec(kind: Hashable) -> tuple[frozenset[str], tuple[str, ...], _Checks]:
    """A record class's field names, the names a line must hold, and each field's (name,
    check, what it must hold), worked out once."""
    known = fields(cast(Any, kind))
    required = tuple(sorted(f.name for f in known if f.metadata["required"]))
    checks = tuple((f.name, f.metadata["check"], f.metadata["must"]) for f in known)
    return frozenset(f.name for f in known), required, checks


class Record:
    """A run file's line. `UNKNOWN` is the advice for a field the record does not declare
    (None: such fields are kept as they are); `MISSING` the advice for a line without a
    required one."""

    UNKNOWN: ClassVar[str | None] = None
    MISSING: ClassVar[str] = "remove the line"

    def line(self) -> dict[str, Any]:
        """The line's JSON object. The fields are plain lists and dicts: no deep copy."""
        return vars(self)

    @classmethod
    def check(cls, line: Any, where: str) -> dict[str, Any]:
        """`line` (a JSON value read back from `where`) if it holds what this record writes;
        RunFileError naming the place and the first field that does not."""
        if not isinstance(line, dict):
            raise RunFileError(f"{where} is {json_kind(line)}, not an object: remove the line")
        known, required, checks = _spec(cast(Hashable, cls))
        if cls.UNKNOWN is not None and not known.issuperset(line):
            unknown = min(set(line) - known)
            raise RunFileError(f"{where}: unknown field `{unknown}` {cls.UNKNOWN}")
        for name in required:  # in order: the first missing one is named
            if name not in line:
                raise RunFileError(f"{where}: no `{name}` field: {cls.MISSING}")
        for name, check, text in checks:
            if name in line:
                check_field(line[name], check, text, where, name)
        return line


_COUNT = "an integer >= 0"
_IDS = "a list of request ids"
_DIMS = "a mapping of part to dims"


@dataclass
class StepRecord(Record):
    """One line of steps.jsonl. A line read back must hold every field but the last three,
    which earlier versions did not write, and no other."""

    UNKNOWN = (
        "(a newer version's steps?): read the folder with the version that wrote it, or serve "
        "the run again"
    )
    MISSING = "serve the run again"

    step: int = field(metadata=must(_count, _COUNT))
    mode: StepMode = field(metadata=must(_one_of(StepMode), _choices(StepMode)))
    prefill: list[dict[str, Any]] = field(
        metadata=must(_list_of(_chunk), "a list of {id, start, end, cached}")
    )
    decode: list[str] = field(metadata=must(_list_of(_str), _IDS))
    preempted: list[str] = field(metadata=must(_list_of(_str), _IDS))
    num_tokens: int = field(metadata=must(_count, _COUNT))
    padded_tokens: int = field(metadata=must(_count, _COUNT))
    bucket: str = field(metadata=must(_str, "a string"))
    duration_s: float = field(metadata=must(non_negative, "a finite number >= 0"))
    # each part's dims before padding: prefill [batch, seq, blocks], decode [batch, blocks]
    needed: dict[str, list[int]] = field(
        default_factory=dict, metadata=must(_part_dims, _DIMS, required=False)
    )
    # each part's bucket, the dims `bucket` names: prefill [batch, seq, blocks], decode
    # [batch, blocks] (an earlier version's steps have none)
    padded: dict[str, list[int]] = field(
        default_factory=dict, metadata=must(_part_dims, _DIMS, required=False)
    )
    # each decode row's tokens, its new one included (what its attention reads), as real
    # runs record them for calibration; a simulated run leaves them out (millions a trace)
    decode_lens: list[int] = field(
        default_factory=list,
        metadata=must(_list_of(_count), "a list of integers >= 0", required=False),
    )

    @classmethod
    def of(
        cls, step: int, plan: StepPlan, meta: ForwardMeta, duration_s: float, lengths: bool = True
    ) -> StepRecord:
        return cls(
            step=step,
            mode=plan.mode,
            prefill=[
                {"id": c.request.id, "start": c.start, "end": c.end, "cached": c.cached}
                for c in plan.prefill
            ],
            decode=list(map(_ID, plan.decode)),  # thousands a step: mapped in C
            preempted=[r.id for r in plan.preempted],
            num_tokens=meta.num_tokens,
            padded_tokens=meta.padded_tokens,
            bucket=meta.bucket,
            duration_s=duration_s,
            needed=meta.needed,
            padded=padded_dims(meta.shape),
            decode_lens=np.asarray(meta.shape.decode_lens).tolist() if lengths else [],
        )

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> StepRecord:
        """The record of a line `check` passed."""
        return cls(**{**line, "mode": StepMode(line["mode"])})


def padded_dims(shape: StepShape) -> dict[str, list[int]]:
    padded = {}
    if shape.prefill is not None:
        padded["prefill"] = list(shape.prefill)
    if shape.decode is not None:
        padded["decode"] = list(shape.decode)
    return padded


def _maybe(check: Check, text: str) -> Mapping[str, Any]:
    return must(_optional(check), text, required=False)


def output_text(request: Request, tokenizer: Any) -> str:
    text = tokenizer.decode(request.output_ids)
    if request.finish_reason == FinishReason.STOP and request.stop:
        # Like vLLM, the text ends before the stop string that ended it.
        cuts = [text.find(s) for s in request.stop if s in text]
        if cuts:
            text = text[: min(cuts)]
    return text


@dataclass
class GenerationRecord(Record):
    """One line of generations.jsonl: a finished request. A line read back must hold `id`,
    `index` and `output_ids`; fields beyond these are kept as they are."""

    id: str = field(metadata=must(_str, "a string"))
    index: int = field(metadata=must(_count, _COUNT))
    prompt: str | None = field(metadata=_maybe(_str, "a string"))
    prompt_tokens: int | None = field(metadata=_maybe(_count, _COUNT))
    max_new_tokens: int | None = field(metadata=_maybe(_int, "an integer"))
    cached_tokens: int | None = field(metadata=_maybe(_count, _COUNT))
    output_ids: list[int] = field(
        metadata=must(_list_of(_count), "a list of token ids (integers >= 0)")
    )
    output_text: str | None = field(metadata=_maybe(_str, "a string"))
    finish_reason: FinishReason | None = field(
        metadata=_maybe(_one_of(FinishReason), f"{_choices(FinishReason)} or null")
    )
    error: str | None = field(metadata=_maybe(_str, "a string or null"))
    ttft_s: float | None = field(metadata=_maybe(non_negative, "a finite number >= 0 or null"))
    e2e_s: float | None = field(metadata=_maybe(non_negative, "a finite number >= 0 or null"))
    itl_s: list[float] | None = field(
        metadata=_maybe(_list_of(non_negative), "a list of finite numbers >= 0")
    )
    # per output token, {token id: log-probability}, if the request asked; left out if not
    logprobs: list[dict[str, float]] = field(
        default_factory=list,
        metadata=must(_list_of(_logprob_entry), "a list of {token id: log-probability}", False),
    )

    def line(self) -> dict[str, Any]:
        line = dict(vars(self))
        if not self.logprobs:
            del line["logprobs"]
        return line

    @classmethod
    def of(cls, request: Request, tokenizer: Any) -> GenerationRecord:
        return cls(
            id=request.id,
            index=request.index,
            prompt=request.prompt,
            prompt_tokens=len(request.prompt_ids),
            max_new_tokens=request.max_new_tokens,
            cached_tokens=request.cached_tokens,
            output_ids=request.output_ids,
            output_text=output_text(request, tokenizer),
            finish_reason=request.finish_reason,
            error=request.error,
            ttft_s=ttft_s(request),
            e2e_s=e2e_s(request),
            itl_s=itl_s(request),
            logprobs=[{str(k): v for k, v in entry.items()} for entry in request.logprobs],
        )
