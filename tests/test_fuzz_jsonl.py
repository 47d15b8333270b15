"""Fuzzing the jsonl workload end to end: whatever a line holds (random JSON values, random
bytes, unicode, control characters, huge numbers), it gets exactly one generation line, in
workload order, and nothing raises."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.executors import build_engine
from pipeline.run_folder.artefacts import GenerationWriter, read_generations
from pipeline.schema import JsonlWorkloadConf
from stages.workload import JsonlWorkload
from tests.helpers import make_config, schema_kwargs

FIELDS = ["id", "max_new_tokens", "arrival_s", "ignore_eos", "stop", "seed",
          "temperature", "top_k", "top_p", "colour"]  # fmt: skip

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 10**400 // 10**380, 1e308, -0.0]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20))
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
prompts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\n"), min_size=0, max_size=40
)
# Mostly well-formed objects with random field values, so that lines reach the engine.
objects = st.fixed_dictionaries(
    {"prompt": prompts},
    optional={name: values for name in FIELDS}
    | {
        "max_new_tokens": st.integers(-2, 6) | values,
        "id": st.sampled_from(["a", "b", 1]) | values,
    },
)


def as_line(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=True).encode("utf-8")


raw_lines = st.one_of(
    objects.map(as_line),
    values.map(as_line),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),
    st.just(b"\xef\xbb\xbf" + as_line({"prompt": "bom inside"})),
    st.just(b'{"prompt": "x", "max_new_tokens": ' + b"9" * 5000 + b"}"),
    st.just(b"[" * 5000),
)


@pytest.fixture(scope="module")
def engine():
    """One tiny engine for every example; each example serves its own requests on it."""
    folder = Path(tempfile.mkdtemp())
    seed_file = folder / "seed.jsonl"
    seed_file.write_text('{"prompt": "a"}\n')
    cfg = make_config(
        ["workload=jsonl", f"workload.path={seed_file}", "max_model_len=64", "max_num_seqs=4",
         "workload.max_new_tokens=4", "sampler=random"]
    )  # fmt: skip
    built, _ = build_engine(cfg)
    return built


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(raw_lines, min_size=1, max_size=6))
def test_every_line_gets_one_generation_in_order(engine, lines):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "fuzz.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        given = schema_kwargs(JsonlWorkloadConf, path=str(path), max_new_tokens=4)
        requests = JsonlWorkload(**given).load(engine.tokenizer)
        expected = sum(1 for raw in lines if raw.removesuffix(b"\r").strip())
        assert len(requests) == expected
        for r in requests:
            assert math.isfinite(r.arrival_s) and 0 <= r.arrival_s <= 86_400
            r.arrival_s = 0.0  # valid waits are tested elsewhere; here, serve at once
        writer = GenerationWriter(folder, engine.tokenizer)
        engine.run(requests, on_finish=writer)
        writer.finish()
        out = read_generations(folder / "generations.jsonl")
        assert [g["index"] for g in out] == list(range(expected))
        assert all(g["finish_reason"] in ("stop", "length", "error") for g in out)
        assert len({g["id"] for g in out}) == expected  # ids unique, even when lines repeat one
