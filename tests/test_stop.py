"""Stop strings end a request at the first token whose text contains one; nothing is lost."""

from __future__ import annotations

import json

from stages.loading.tokenizer import ByteTokenizer
from tests.helpers import serve

PROMPTS = ["tell me a story", "abc", "the quick brown fox", "0123456789", "hello", "zz top"]


def run(tmp_path, stops: dict[str, list[str]] | None = None):
    path = tmp_path / "prompts.jsonl"
    lines = []
    for i, prompt in enumerate(PROMPTS):
        line = {"id": f"p{i}", "prompt": prompt, "max_new_tokens": 24, "ignore_eos": True}
        if stops and line["id"] in stops:
            line["stop"] = stops[line["id"]]
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    got, _ = serve(["workload=jsonl", f"workload.path={path}"])
    return got


def first_new_printable(text: str) -> tuple[int, str] | None:
    """An ASCII character of the output that first appears after its first token."""
    for i, ch in enumerate(text):
        if i >= 1 and 32 <= ord(ch) < 127 and ch not in text[:i]:
            return i, ch
    return None


def test_a_stop_string_cuts_the_output_where_it_first_appears(tmp_path):
    tok = ByteTokenizer(add_bos=True)
    free = run(tmp_path)
    stops, expected = {}, {}
    for rid, r in free.items():
        text = [tok.decode([t]) for t in r.output_ids]
        found = first_new_printable("".join(t if len(t) == 1 else "\0" for t in text))
        if found:
            i, ch = found
            stops[rid] = [ch, "never-appears"]
            expected[rid] = r.output_ids[: i + 1]
    assert len(stops) >= 3, "too few outputs with a usable stop character"

    stopped = run(tmp_path, stops)
    for rid, r in stopped.items():
        if rid in stops:
            assert r.finish_reason == "stop", rid
            assert r.output_ids == expected[rid], rid
        else:  # requests without stop strings are untouched
            assert r.output_ids == free[rid].output_ids
            assert r.finish_reason == "length"
