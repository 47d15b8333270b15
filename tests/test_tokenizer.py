from hypothesis import given
from hypothesis import strategies as st

from stages.loading.tokenizer import ByteTokenizer


@given(st.text())
def test_byte_tokenizer_round_trips_any_unicode(text):
    tokenizer = ByteTokenizer(add_bos=True)
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_id
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_special_ids_are_not_text():
    tokenizer = ByteTokenizer(add_bos=False)
    assert (
        tokenizer.decode([tokenizer.bos_id, 104, 105, tokenizer.eos_id, tokenizer.pad_id]) == "hi"
    )
