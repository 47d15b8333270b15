"""The run folder's lines: what json_line encodes, and the generations' final order."""

from __future__ import annotations

import gc
import json

from pipeline.run_folder import artefacts
from stages.loading.tokenizer import ByteTokenizer
from stages.scheduling.request import Request
from tests.helpers import serve


def test_json_lines_are_utf8_json_even_for_what_orjson_refuses():
    cases = [
        {"id": "plain", "itl_s": [0.1, 1 / 3], "n": 2**40},
        {"id": "ünï", "prompt": "ok"},
        {"id": "lone", "prompt": "a\ud800b"},  # a lone surrogate: orjson refuses it
        {"id": "big", "n": 2**70},  # beyond 64 bits: orjson refuses it
        {"id": "lp", "logprobs": [{"1": float("-inf")}]},
    ]
    for value in cases:
        line = artefacts.json_line(value)
        assert isinstance(line, bytes) and line.endswith(b"\n") and line.count(b"\n") == 1
        assert json.loads(line.decode("utf-8")) == value  # the oracle: json reads it back


def test_generations_are_rewritten_in_workload_order(tmp_path):
    writer = artefacts.GenerationWriter(tmp_path, ByteTokenizer(add_bos=True))
    for index in (2, 0, 1):
        r = Request(f"r{index}", index, "p", [1], max_new_tokens=1)
        r.output_ids, r.token_times = [65], [0.5]
        r.finish("length", 0.5)
        writer(r)
    finished = [g["index"] for g in artefacts.read_generations(tmp_path / "generations.jsonl")]
    writer.finish()
    final = artefacts.read_generations(tmp_path / "generations.jsonl")
    assert finished == [2, 0, 1] and [g["index"] for g in final] == [0, 1, 2]
    assert [g["output_text"] for g in final] == ["A"] * 3


def test_serving_leaves_the_collector_as_it_found_it():
    before = gc.get_threshold()
    serve(["executor=simulated", "hardware=gaudi3"])
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
