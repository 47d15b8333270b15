"""`tokenizer=gguf`: the tokenizer a GGUF file carries (vocabulary, specials, chat template)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stages.chat import render_chat
from stages.gguf.config import token_ids
from stages.gguf.reader import read_gguf_header
from stages.gguf.vocab import CONTROL, build_tokenizer


class GgufTokenizer:
    """tokenizer.ggml.* of a GGUF file, built into a `tokenizers` tokenizer; BOS, EOS (with
    end-of-turn) and PAD from the file, BOS put first where tokenizer.ggml.add_bos_token
    says (or `add_bos` overrides), and tokenizer.chat_template for chat messages."""

    def __init__(self, path: str, add_bos: bool | None = None) -> None:
        header = read_gguf_header(path, key="tokenizer.path")
        metadata = header.metadata
        self._tokenizer = build_tokenizer(metadata, header.path)
        self._tokens = metadata["tokenizer.ggml.tokens"]
        self.vocab_size = len(self._tokens)
        bos = token_ids(header, "bos")
        self.bos_id = bos[0] if bos else None
        self._eos_ids = frozenset(token_ids(header, "eos", "eot", "eom"))
        for name, ids in (("bos", bos), ("eos", self._eos_ids)):
            if any(not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(f"{header.path}: tokenizer.ggml.{name}_token_id is not a token")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        if add_bos is not None:
            self.add_bos = add_bos
        if self.add_bos and self.bos_id is None:
            raise ValueError(
                f"{header.path} names no tokenizer.ggml.bos_token_id: set tokenizer.add_bos=false"
            )
        pad = token_ids(header, "padding")
        # Padding rows only need some valid id; they are never attended to or sampled.
        self.pad_id = next((i for i in (*pad, *sorted(self._eos_ids)) if i < self.vocab_size), 0)
        eos = token_ids(header, "eos")
        self._eos_text = self._token(eos[0]) if eos else ""
        template = metadata.get("tokenizer.chat_template")
        self.chat_template: str | None = template if isinstance(template, str) else None
        types = metadata.get("tokenizer.ggml.token_type")
        self._special = frozenset(
            i for i, t in enumerate(types if types is not None else ()) if int(t) == CONTROL
        )

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._eos_ids

    @property
    def special_ids(self) -> frozenset[int]:
        """Control tokens (chat markers and the like)."""
        return self._special

    def _token(self, token: int | None) -> str:
        return "" if token is None else self._tokens[token]

    def encode(self, text: str) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[int]]:
        """The prompt text of chat `messages` under the file's template (the plain one where
        it has none), and its ids (the template writes any BOS itself, so none is added:
        transformers' rule)."""
        text = render_chat(self.chat_template, messages, self._token(self.bos_id), self._eos_text)
        return text, self._tokenizer.encode(text, add_special_tokens=False).ids
