"""`tokenizer=gguf`: the tokenizer a GGUF file carries (vocabulary, specials, chat template)."""

from __future__ import annotations

from stages.loading.gguf.config import token_ids
from stages.loading.gguf.reader import read_gguf_header
from stages.loading.gguf.vocab import CONTROL, build_tokenizer
from stages.loading.tokenizer import LibraryTokenizer, SpecialTokens


class GgufTokenizer(LibraryTokenizer):
    """tokenizer.ggml.* of a GGUF file, built into a `tokenizers` tokenizer; BOS, EOS (with
    end-of-turn) and PAD from the file, BOS put first where tokenizer.ggml.add_bos_token
    says (or `add_bos` overrides: None keeps the file's), and tokenizer.chat_template for
    chat messages."""

    def __init__(self, path: str, add_bos: bool | None) -> None:
        header = read_gguf_header(path, key="tokenizer.path")
        metadata = header.metadata
        tokenizer = build_tokenizer(metadata, header.path)
        tokens = metadata["tokenizer.ggml.tokens"]
        bos = token_ids(header, "bos")
        eos_ids = frozenset(token_ids(header, "eos", "eot", "eom"))
        for name, ids in (("bos", bos), ("eos", eos_ids)):
            if any(not 0 <= i < len(tokens) for i in ids):
                raise ValueError(f"{header.path}: tokenizer.ggml.{name}_token_id is not a token")
        if add_bos is None:
            add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        if add_bos and not bos:
            raise ValueError(
                f"{header.path} names no tokenizer.ggml.bos_token_id: set tokenizer.add_bos=false"
            )
        eos = token_ids(header, "eos")
        types = metadata.get("tokenizer.ggml.token_type")
        special = SpecialTokens(
            bos_id=bos[0] if bos else None,
            eos_ids=eos_ids,
            pad_ids=tuple(token_ids(header, "padding")),
            control_ids=frozenset(
                i for i, t in enumerate(types if types is not None else ()) if int(t) == CONTROL
            ),
            bos_text=tokens[bos[0]] if bos else "",
            eos_text=tokens[eos[0]] if eos else "",
        )
        template = metadata.get("tokenizer.chat_template")
        super().__init__(
            tokenizer,
            len(tokens),
            special,
            add_bos,
            False,  # the file's specials are put by add_bos alone
            template if isinstance(template, str) else None,
        )
