"""The run files' line records: a line a record writes reads back as the same record, and a
line without a field or with a wrong value is refused with one line naming the field."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from pipeline.run_folder.artefacts import json_line
from pipeline.run_folder.records import GenerationRecord, StepRecord
from pipeline.run_folder.run_files import RunFileError
from stages.scheduling.request import FinishReason, Request, StepMode


class Letters:
    """A tokenizer whose text is each id as a letter: 0 is a, 1 is b."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def step() -> StepRecord:
    return StepRecord(
        step=3,
        mode=StepMode.MIXED,
        prefill=[{"id": "r1", "start": 0, "end": 8, "cached": 4}],
        decode=["r0"],
        preempted=[],
        num_tokens=9,
        padded_tokens=16,
        bucket="(1, 16)",
        duration_s=0.25,
        needed={"prefill": [1, 8, 1], "decode": [1, 2]},
        padded={"prefill": [1, 16, 2], "decode": [1, 2]},
        decode_lens=[17],
    )


def request() -> Request:
    r = Request("r7", 7, "ab", [0, 1], max_new_tokens=3, arrival_s=1.0, stop=["c"])
    r.output_ids = [3, 2, 3]  # "dcd": the stop string "c" cuts the text to "d"
    r.token_times = [1.5, 1.75, 2.25]
    r.finish_s = 2.5
    r.finish_reason = FinishReason.STOP
    r.logprobs = [{3: -0.5}, {2: -1.0}, {3: -0.25}]
    return r


def read_back(line: bytes) -> dict:
    return json.loads(line)


def test_a_step_record_round_trips():
    record = step()
    line = read_back(json_line(record.line(), ensure_ascii=True))
    assert list(line) == [f.name for f in fields(StepRecord)]
    assert StepRecord.from_line(StepRecord.check(line, "steps.jsonl:1")) == record


def test_a_generation_record_holds_the_request_and_round_trips():
    line = read_back(json_line(GenerationRecord.of(request(), Letters()).line()))
    assert line == {  # worked out by hand from request()
        "id": "r7",
        "index": 7,
        "prompt": "ab",
        "prompt_tokens": 2,
        "max_new_tokens": 3,
        "cached_tokens": 0,
        "output_ids": [3, 2, 3],
        "output_text": "d",
        "finish_reason": "stop",
        "error": None,
        "ttft_s": 0.5,
        "e2e_s": 1.5,
        "itl_s": [0.25, 0.5],
        "logprobs": [{"3": -0.5}, {"2": -1.0}, {"3": -0.25}],
    }
    assert GenerationRecord.check(line, "generations.jsonl:1") == GenerationRecord(**line).line()


def test_a_generation_without_log_probabilities_leaves_the_field_out():
    r = request()
    r.logprobs = []
    line = GenerationRecord.of(r, Letters()).line()
    assert set(line) == {f.name for f in fields(GenerationRecord)} - {"logprobs"}


@pytest.mark.parametrize("missing", ["step", "mode", "duration_s"])
def test_a_step_line_without_a_field_is_refused(missing):
    line = read_back(json_line(step().line()))
    del line[missing]
    with pytest.raises(RunFileError) as err:
        StepRecord.check(line, "steps.jsonl:4")
    assert str(err.value) == f"steps.jsonl:4: no `{missing}` field: serve the run again"


@pytest.mark.parametrize("optional", ["needed", "padded", "decode_lens"])
def test_a_step_line_of_an_earlier_version_reads(optional):
    line = read_back(json_line(step().line()))
    del line[optional]
    assert StepRecord.check(line, "steps.jsonl:1") is line


@pytest.mark.parametrize(
    ("key", "value", "must"),
    [
        ("num_tokens", -1, "an integer >= 0"),
        ("num_tokens", True, "an integer >= 0"),
        ("duration_s", "fast", "a finite number >= 0"),
        ("mode", "sideways", "one of " + ", ".join(StepMode)),
        ("decode", ["r0", 1], "a list of request ids"),
    ],
)
def test_a_step_line_with_a_wrong_value_is_refused(key, value, must):
    line = {**step().line(), key: value}
    with pytest.raises(RunFileError) as err:
        StepRecord.check(line, "steps.jsonl:2")
    assert str(err.value) == f"steps.jsonl:2: field `{key}` is {value!r}, which must be {must}"
    assert "\n" not in str(err.value)


def test_a_step_line_with_a_field_no_step_has_is_refused():
    line = {**step().line(), "colour": 1}
    with pytest.raises(RunFileError, match=r"^steps.jsonl:1: unknown field `colour` "):
        StepRecord.check(line, "steps.jsonl:1")


def test_a_generation_line_keeps_fields_beyond_the_record():
    line = {"id": "x", "index": 0, "output_ids": [1], "note": "kept"}
    assert GenerationRecord.check(line, "g:1") == line


@pytest.mark.parametrize("missing", ["id", "output_ids"])
def test_a_generation_line_without_a_field_is_refused(missing):
    line = {"id": "x", "index": 0, "output_ids": [1]}
    del line[missing]
    with pytest.raises(RunFileError) as err:
        GenerationRecord.check(line, "g:3")
    assert str(err.value) == f"g:3: no `{missing}` field: remove the line"


def test_a_generation_line_with_a_wrong_value_is_refused():
    line = {"id": "x", "index": 0, "output_ids": [1], "finish_reason": "tired"}
    with pytest.raises(RunFileError) as err:
        GenerationRecord.check(line, "g:1")
    reasons = ", ".join(FinishReason)
    assert str(err.value) == (
        f"g:1: field `finish_reason` is 'tired', which must be one of {reasons} or null"
    )


def test_a_line_that_is_no_object_is_refused():
    with pytest.raises(RunFileError, match=r"^g:1 is a list, not an object: remove the line$"):
        GenerationRecord.check([1], "g:1")
