"""Trace workloads: each format's rows become the right requests, arrivals and lengths; bad
rows fail alone with their line; formats are detected; Mooncake's hash ids share blocks;
prompt ids are drawn lazily and deterministically; the real pipeline serves a trace."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import numpy as np
import pytest

from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from stages.loading.tokenizer import ByteTokenizer
from stages.scheduling.request import Request
from stages.trace import (
    PromptIdSource,
    SeededPromptIds,
    TraceWorkload,
    datetime_seconds,
    detect_format,
)
from tests.helpers import make_config, serve, trace_workload

# (arrival seconds, prompt tokens, output tokens): the rows every format's file is made from.
ROWS = [(0.0, 40, 5), (0.5, 70, 3), (1.25, 20, 6), (3.0, 33, 4)]
T0 = datetime(2023, 11, 16, 18, 15, 46, 680590)


def azure_line(t: float, n_in: int, n_out: int) -> str:
    stamp = (T0 + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"  # 7 digits
    return f"{stamp},{n_in},{n_out}"


def burstgpt_line(t: float, n_in: int, n_out: int, model: str = "ChatGPT") -> str:
    return f"{1000 + t},{model},{n_in},{n_out},{n_in + n_out},Conversation log"


def mooncake_line(t: float, n_in: int, n_out: int, hash_ids: list[int] | None = None) -> str:
    hashes = hash_ids if hash_ids is not None else list(range(-(-n_in // 16)))
    entry = {"timestamp": int(5000 + t * 1000), "input_length": n_in, "output_length": n_out}
    return json.dumps({**entry, "hash_ids": hashes})


def vidur_line(t: float, n_in: int, n_out: int) -> str:
    return f"{7.5 + t},{n_in},{n_out}"


HEADERS = {
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "mooncake": None,
    "vidur": "arrived_at,num_prefill_tokens,num_decode_tokens",
}
LINES = {"azure": azure_line, "burstgpt": burstgpt_line, "mooncake": mooncake_line}
LINES["vidur"] = vidur_line
SUFFIX = {"azure": "csv", "burstgpt": "csv", "mooncake": "jsonl", "vidur": "csv"}


def write_trace(tmp_path, fmt: str, lines: list[str], name: str = "trace"):
    path = tmp_path / f"{name}.{SUFFIX.get(fmt, 'json')}"
    header = [HEADERS[fmt]] if HEADERS.get(fmt) else []
    path.write_text("\n".join(header + lines) + "\n")
    return path


def timed_trace(tmp_path, fmt: str, rows=ROWS):
    return write_trace(tmp_path, fmt, [LINES[fmt](*row) for row in rows], name=fmt)


def sharegpt_file(tmp_path, entries) -> object:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries, indent=2))
    return path


def chat(rid: str, *turns: tuple[str, str]) -> dict:
    return {"id": rid, "conversations": [{"from": who, "value": text} for who, text in turns]}


def load(path, **kwargs) -> tuple[TraceWorkload, list[Request]]:
    workload = trace_workload(path, **{"max_model_len": 256, **kwargs})
    return workload, workload.load(ByteTokenizer(add_bos=True))


TIMED = ["azure", "burstgpt", "mooncake", "vidur"]


@pytest.mark.parametrize("fmt", TIMED)
def test_rows_become_requests_with_shifted_arrivals_and_lengths(tmp_path, fmt):
    workload, requests = load(timed_trace(tmp_path, fmt))
    assert workload.format == fmt
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 0.5, 1.25, 3.0], abs=1e-5)
    assert [len(r.prompt_ids) for r in requests] == [40, 70, 20, 33]
    assert [r.max_new_tokens for r in requests] == [5, 3, 6, 4]
    assert all(r.ignore_eos and not r.finished for r in requests)
    first = 2 if HEADERS[fmt] else 1  # the first row's line: after the header, if any
    assert [r.id for r in requests] == [f"line-{n}" for n in range(first, first + 4)]
    assert workload.counts["rows"] == 4 and workload.counts["requests"] == 4


@pytest.mark.parametrize("fmt", TIMED)
def test_window_scale_and_first_n(tmp_path, fmt):
    path = timed_trace(tmp_path, fmt)
    # The window [0.5, 3.0) of trace time keeps rows 2 and 3, measured from its start, and
    # time_scale=0.5 halves the gaps.
    workload, requests = load(path, start_s=0.5, duration_s=2.5, time_scale=0.5)
    assert [len(r.prompt_ids) for r in requests] == [70, 20]
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 0.375], abs=1e-5)
    assert workload.counts["outside_window"] == 2
    _, requests = load(path, start_s=1.0)  # duration 0: to the end
    assert [len(r.prompt_ids) for r in requests] == [20, 33]
    assert [r.arrival_s for r in requests] == pytest.approx([0.25, 2.0], abs=1e-5)
    workload, requests = load(path, num_requests=3, time_scale=2.0)
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 1.0, 2.5], abs=1e-5)
    assert workload.counts["past_num_requests"] == 1


BAD_ROWS = {
    "azure": ["2023-11-16 18:15:47.0000000,12,x", "yesterday,12,3", "2023-11-16 18:15:48,5"],
    "burstgpt": ["12.5,ChatGPT,abc,4,4,Conversation log", "soon,ChatGPT,3,4,7,API log"],
    "mooncake": ['{"timestamp": 1, "input_length": 3', '{"timestamp": 9, "input_length": 4}'],
    "vidur": ["8.0,-3,2", "8.5,3"],
}


@pytest.mark.parametrize("fmt", TIMED)
def test_a_malformed_row_is_that_requests_error_with_its_line(tmp_path, fmt):
    good = [LINES[fmt](*row) for row in ROWS]
    bad = BAD_ROWS[fmt]
    path = write_trace(tmp_path, fmt, good[:2] + bad + good[2:])
    workload, requests = load(path)
    offset = 2 if HEADERS[fmt] else 1  # the first row's line number
    bad_lines = [offset + 2 + i for i in range(len(bad))]
    failed = [r for r in requests if r.finished]
    assert [r.id for r in failed] == [f"line-{n}" for n in bad_lines]
    for request, line in zip(failed, bad_lines, strict=True):
        assert request.finish_reason == "error"
        assert request.error.startswith(f"{path.name} line {line}: ")
    served = [r for r in requests if not r.finished]
    assert [len(r.prompt_ids) for r in served] == [40, 70, 20, 33]
    assert workload.counts["malformed"] == len(bad)
    # A bad row has the time of the good row before it (0.5 s) for the window.
    _, requests = load(path, start_s=0.5)
    assert [r.finished for r in requests] == [False] + [True] * len(bad) + [False, False]
    assert all(r.arrival_s == 0.0 for r in requests[: 1 + len(bad)])
    workload, requests = load(path, start_s=0.75)
    assert not any(r.finished for r in requests)
    assert workload.counts["outside_window"] == 2 + len(bad)


def test_field_errors_name_the_field(tmp_path):
    expected = ["GeneratedTokens='x'", "TIMESTAMP: 'yesterday'", "2 fields, the header has 3"]
    for line, message in zip(BAD_ROWS["azure"], expected, strict=True):
        assert message in one_error(tmp_path, "azure", line)
    assert "missing field(s) ['output_length', 'hash_ids']" in one_error(
        tmp_path, "mooncake", BAD_ROWS["mooncake"][1]
    )
    assert "num_prefill_tokens=-3 must be >= 1" in one_error(tmp_path, "vidur", "8.0,-3,2")
    assert "'soon' is not a number of seconds" in one_error(
        tmp_path, "burstgpt", BAD_ROWS["burstgpt"][1]
    )


def one_error(tmp_path, fmt: str, line: str) -> str:
    path = write_trace(tmp_path, fmt, [LINES[fmt](*ROWS[0]), line], name="one")
    _, requests = load(path)
    return requests[1].error


def test_azure_date_times_keep_their_seven_digits():
    whole = datetime_seconds("2023-11-16 18:15:46")
    assert datetime_seconds("2023-11-16 18:15:46.6805901") - whole == pytest.approx(
        0.6805901, abs=1e-6
    )
    # A UTC offset, as the 2024 trace writes it, is taken off.
    assert datetime_seconds("2023-11-16 20:15:46+02:00") == whole
    assert whole == (datetime(2023, 11, 16, 18, 15, 46) - datetime(1970, 1, 1)).total_seconds()


def test_burstgpt_model_filter_and_failed_rows(tmp_path):
    lines = [
        burstgpt_line(0.0, 10, 4, "ChatGPT"),
        burstgpt_line(0.4, 11, 0, "ChatGPT"),  # a failed request: 0 response tokens
        burstgpt_line(0.8, 12, 5, "GPT-4"),
        burstgpt_line(1.2, 13, 6, "ChatGPT"),
        burstgpt_line(1.6, 14, 0, "GPT-4"),
    ]
    path = write_trace(tmp_path, "burstgpt", lines)
    workload, requests = load(path)
    assert [len(r.prompt_ids) for r in requests] == [10, 12, 13]
    assert workload.counts["failed_skipped"] == 2 and workload.counts["rows"] == 5
    workload, requests = load(path, model_filter="GPT-4")
    assert [(len(r.prompt_ids), r.max_new_tokens) for r in requests] == [(12, 5)]
    assert requests[0].arrival_s == 0.0  # the kept rows' first arrival is the origin
    assert workload.counts["other_model_skipped"] == 3
    assert workload.counts["failed_skipped"] == 1


def test_mooncake_hash_ids_share_blocks(tmp_path):
    lines = [
        mooncake_line(0.0, 40, 2, [1, 2, 3]),  # 16 + 16 + 8 tokens
        mooncake_line(0.1, 36, 2, [1, 2, 7]),  # shares blocks 1 and 2
        mooncake_line(0.2, 20, 2, [9, 2]),  # block 2 at another place
        mooncake_line(0.3, 40, 2, [1]),  # more tokens than its hash ids cover
    ]
    path = write_trace(tmp_path, "mooncake", lines)
    _, requests = load(path, trace_block_size=16)
    a, b, c, d = (list(r.prompt_ids) for r in requests)
    assert [len(x) for x in (a, b, c, d)] == [40, 36, 20, 40]
    assert a[:32] == b[:32]  # the shared prefix is the same ids
    assert a[32:36] != b[32:36]  # hash ids 3 and 7 differ
    assert c[16:20] == a[16:20]  # hash id 2 is the same block wherever it is
    assert c[:16] != a[:16]
    assert d[:16] == a[:16] and d[16:32] != a[16:32]  # beyond its ids: the row's own stream
    # An independent oracle: a block is the seeded stream of its hash id.
    vocab = np.arange(256)
    expected = vocab[np.random.default_rng((0, 1, 2)).integers(0, 256, 16)].tolist()
    assert a[16:32] == expected


def test_sharegpt_first_human_turn_and_the_gpt_reply(tmp_path):
    entries = [
        chat("a", ("human", "What is a KV cache?"), ("gpt", "A store of keys and values.")),
        chat("b", ("system", "be brief"), ("human", "hi"), ("gpt", "hello"), ("human", "x")),
        chat("c", ("gpt", "no question")),  # no human turn: skipped
        chat("d", ("human", "alone")),  # no reply: skipped
        {"id": "e", "conversations": "not a list"},  # malformed
        chat("a", ("human", "again"), ("gpt", "yes")),  # a repeated id
    ]
    path = sharegpt_file(tmp_path, entries)
    workload, requests = load(path)
    tok = ByteTokenizer(add_bos=True)
    assert [r.id for r in requests[:2]] == ["a", "b"]
    assert requests[0].prompt == "What is a KV cache?"
    assert requests[0].prompt_ids == tok.encode("What is a KV cache?")
    assert requests[0].max_new_tokens == len(tok.encode("A store of keys and values."))
    assert requests[1].prompt == "hi" and requests[1].max_new_tokens == len(tok.encode("hello"))
    bad = requests[2]
    # Entry e's brace is on the line before its id: that line's number is the id's index.
    line = path.read_text().splitlines().index('    "id": "e",')
    assert bad.finished and bad.error.startswith(f"sharegpt.json line {line}: ")
    assert requests[3].id != "a" and requests[3].prompt == "again"
    assert workload.counts["unpaired_skipped"] == 2 and workload.counts["malformed"] == 1
    assert all(r.arrival_s == 0.0 for r in requests)
    _, timed = load(path, rate=4.0, num_requests=2)
    assert len(timed) == 2 and 0 < timed[0].arrival_s < timed[1].arrival_s


def test_sharegpt_bad_json_ends_the_read_with_its_line(tmp_path):
    path = tmp_path / "broken.json"
    good = json.dumps(chat("a", ("human", "hi"), ("gpt", "hello")))
    path.write_text(f'[\n{good},\n{{"id": "b", oops}}\n]\n')
    _, requests = load(path)
    assert requests[0].id == "a" and not requests[0].finished
    assert requests[1].error.startswith("broken.json line 3: bad JSON")


@pytest.mark.parametrize("fmt", [*TIMED, "sharegpt"])
def test_auto_detection_picks_each_format(tmp_path, fmt):
    if fmt == "sharegpt":
        path = sharegpt_file(tmp_path, [chat("a", ("human", "hi"), ("gpt", "yo"))])
    else:
        path = timed_trace(tmp_path, fmt)
    assert detect_format(path) == fmt
    assert trace_workload(path, max_model_len=256).format == fmt


FORMAT_NAMES = "azure (CSV TIMESTAMP,ContextTokens,GeneratedTokens); burstgpt"


def test_another_format_gets_one_line(tmp_path):
    azure = timed_trace(tmp_path, "azure")
    with pytest.raises(ValueError, match="looks like a azure trace, not vidur") as err:
        trace_workload(azure, format="vidur")
    assert "\n" not in str(err.value) and "workload.format=azure" in str(err.value)
    other = tmp_path / "other.csv"
    other.write_text("when,prompt,answer\n1,2,3\n")
    with pytest.raises(ValueError) as err:
        trace_workload(other)
    message = str(err.value)
    assert "\n" not in message and FORMAT_NAMES in message
    for name in ("mooncake (JSONL", "sharegpt (JSON list", "vidur (CSV arrived_at"):
        assert name in message
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(json.dumps({"prompt": "hello"}) + "\n")
    with pytest.raises(ValueError, match="is not a trace this reads"):
        trace_workload(jsonl)


def test_bad_keys_become_one_line_config_errors(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("when,prompt,answer\n")
    base = ["workload=trace", f"workload.path={other}"]
    with pytest.raises(ConfigError, match="is not a trace this reads"):
        build_engine(make_config(base))
    azure = str(timed_trace(tmp_path, "azure"))
    cases = {
        "workload.model_filter=GPT-4": "model_filter applies to burstgpt",
        "workload.rate=2.0": "drop workload.rate",
        "workload.start_s=99": "gives no request",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            build_engine(make_config(["workload=trace", f"workload.path={azure}", override]))


@pytest.mark.parametrize("fmt", ["azure", "sharegpt"])
def test_too_long_clips_or_errors(tmp_path, fmt):
    if fmt == "sharegpt":
        long = chat("long", ("human", "x" * 300), ("gpt", "ok"))
        path = sharegpt_file(tmp_path, [chat("a", ("human", "hi"), ("gpt", "yo")), long])
    else:
        path = timed_trace(tmp_path, fmt, [(0.0, 40, 5), (0.5, 300, 3)])
    workload, requests = load(path, max_model_len=128)
    assert len(requests[1].prompt_ids) == 127  # room for one output token
    _, whole = load(path, max_model_len=512)
    assert list(requests[1].prompt_ids) == list(whole[1].prompt_ids)[:127]  # its start
    assert not requests[1].finished and workload.counts["clipped"] == 1
    workload, requests = load(path, max_model_len=128, too_long="error")
    assert requests[1].finish_reason == "error" and "max_model_len=128" in requests[1].error
    assert "workload.too_long=clip" in requests[1].error
    assert not requests[0].finished
    assert workload.counts["rejected"] == 1 and workload.counts["clipped"] == 0


def test_seeded_prompt_ids_are_lazy_and_deterministic():
    vocab = np.arange(256)  # the byte tokenizer's vocabulary without BOS, EOS and PAD
    source = PromptIdSource(vocab, seed=3, block_size=16, capacity=2)
    ids = SeededPromptIds(1000, 17, source)
    assert len(ids) == 1000 and ids._ids is None  # the length alone draws nothing
    drawn = list(ids)
    assert len(drawn) == 1000 and max(drawn) < 256
    assert ids[5] == drawn[5] and ids[10:20] == drawn[10:20] and ids[-1] == drawn[-1]
    assert ids + [7, 8] == [*drawn, 7, 8] and [1] + ids == [1, *drawn]
    assert ids == drawn and ids == SeededPromptIds(1000, 17, source)
    assert ids != SeededPromptIds(1000, 18, source)
    assert list(ids.prefix(333)) == drawn[:333]  # a shorter draw is the longer one's start
    blocks = SeededPromptIds(45, (1, (4, 5, 6)), source)
    assert list(blocks.prefix(21)) == list(blocks)[:21]
    assert ids != SeededPromptIds(1000, 17, PromptIdSource(vocab, 4, 16, 2))
    # Only the `capacity` most recently used are kept; a dropped one draws the same again.
    others = [SeededPromptIds(50, k, source) for k in (1, 2)]
    for other in others:
        other[0]
    assert ids._ids is None and all(o._ids is not None for o in others)
    assert list(ids) == drawn


def test_drawn_prompts_avoid_the_tokenizers_special_ids(tmp_path):
    path = timed_trace(tmp_path, "vidur", [(0.0, 3000, 1), (0.1, 3000, 1)])
    _, requests = load(path, max_model_len=4096)
    ids = np.array([list(r.prompt_ids) for r in requests])
    assert ids.max() < 256 and ids.min() >= 0  # BOS 256, EOS 257, PAD 258 never drawn
    assert len(np.unique(ids)) == 256  # and every other id can be
    assert (ids[0] != ids[1]).any()  # each row has its own stream


def test_rows_draw_no_prompt_ids_at_load(tmp_path):
    _, requests = load(timed_trace(tmp_path, "azure"))
    assert all(isinstance(r.prompt_ids, SeededPromptIds) for r in requests)
    assert all(r.prompt_ids._ids is None for r in requests)


@pytest.mark.parametrize("fmt", [*TIMED, "sharegpt"])
def test_the_pipeline_serves_every_trace_request(tmp_path, fmt):
    if fmt == "sharegpt":
        entries = [chat(f"c{i}", ("human", "tell me " * i), ("gpt", "ok " * i)) for i in (1, 3, 5)]
        path = sharegpt_file(tmp_path, entries)
        expected = [len(ByteTokenizer(add_bos=True).encode("ok " * i)) for i in (1, 3, 5)]
    else:
        rows = [(t / 10, n_in, n_out) for t, n_in, n_out in ROWS]  # a fast replay
        path = timed_trace(tmp_path, fmt, rows)
        expected = [n_out for _, _, n_out in rows]
    got, engine = serve(["workload=trace", f"workload.path={path}", "workload.trace_block_size=16"])
    assert engine.workload_counts["requests"] == len(expected)  # into metrics.json
    requests = sorted(got.values(), key=lambda r: r.index)
    assert [r.error for r in requests] == [None] * len(expected)
    assert [r.finish_reason for r in requests] == ["length"] * len(expected)
    assert [len(r.output_ids) for r in requests] == expected
    for r in requests:
        assert r.token_times[0] >= r.arrival_s  # never served before it arrived
