"""What a stream sends step by step adds up to the request's final text (the one
generations.jsonl holds), whatever the bytes, the token boundaries and the stop strings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.run_folder.records import output_text
from pipeline.serve.replies import TextStream
from stages.loading.chat import render_chat
from stages.loading.tokenizer import ByteTokenizer
from stages.scheduling.request import Request
from stages.scheduling.stopping import StopRule

TOKENIZER = ByteTokenizer(add_bos=True)
# Bytes of ASCII, of multi-byte characters and stray continuation bytes, so that steps
# cut characters in half and some never complete.
BYTES = st.lists(st.sampled_from([*b"ab x", *"é€😀".encode(), 0x80, 0xBF]), max_size=40)
STOPS = st.lists(st.sampled_from(["b", "ab", "x a", "é", "€😀", "zz"]), max_size=2)


@settings(max_examples=200, deadline=None)
@given(ids=BYTES, stop=STOPS, cuts=st.lists(st.integers(1, 4), min_size=40, max_size=40))
def test_streamed_deltas_add_up_to_the_final_text(ids, stop, cuts):
    request = Request("r", 0, "p", [1], max_new_tokens=len(ids) or 1, stop=stop)
    rule = StopRule(TOKENIZER.eos_ids, 10_000, TOKENIZER.decode)
    text, sent, steps = TextStream(TOKENIZER, stop), "", iter(cuts)
    position = 0
    while position < len(ids) and not request.finished:
        step = ids[position : position + next(steps)]
        position += len(step)
        for token in step:  # the engine checks the stop after every token
            request.append_token(token, 0.0, None)
            reason = rule.reason(request)
            if reason:
                request.finish(reason, 0.0)
                break
        new = request.output_ids[len(text.ids) :]
        if request.finished:
            sent += text.final(request, new)
        else:
            piece = text.add(new)
            sent += piece
            assert not any(s in sent for s in stop)  # a stop string is never sent
    if not request.finished:
        request.finish("length", 0.0)
        sent += text.final(request, [])
    assert sent == output_text(request, TOKENIZER)


def test_the_plain_chat_template_and_a_jinja_one():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_chat(None, messages) == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    template = (
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    assert render_chat(template, messages) == "[system] Be brief.\n[user] Hi\n[assistant] "
