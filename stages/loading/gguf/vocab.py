"""A GGUF file's vocabulary (tokenizer.ggml.*) as a `tokenizers` tokenizer.

Two styles, as llama.cpp reads them (llama-vocab.cpp):
- `gpt2`: byte-level BPE with the file's merges; the text is first split by the regex of
  tokenizer.ggml.pre (the pre-tokenizer the model was trained with).
- `llama`: SentencePiece-style BPE: spaces become "▁", a "▁" goes in front of the text,
  pieces are merged by the score of the piece they make (highest first), and characters
  missing from the vocabulary fall back to their bytes' <0xXX> tokens.
Control and user-defined tokens (token types 3 and 4) are matched whole in the text, before
any splitting, as special tokens are.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pre

CONTROL, USER_DEFINED = 3, 4
NORMAL, BYTE = 1, 6

# GPT-2's own split, and the splits later models use (llama.cpp's llm_tokenizer_bpe regexes).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split(regex: str) -> pre.PreTokenizer:
    return pre.Split(Regex(regex), behavior="isolated", invert=False)


def _byte_level() -> pre.PreTokenizer:
    return pre.ByteLevel(add_prefix_space=False, use_regex=False)


# tokenizer.ggml.pre -> the pre-tokenizer (regex splits, then bytes to GPT-2's characters).
PRE_TOKENIZERS = {
    "default": lambda: pre.Sequence([_split(_GPT2), _byte_level()]),
    "gpt-2": lambda: pre.Sequence([_split(_GPT2), _byte_level()]),
    "smollm": lambda: pre.Sequence(
        [pre.Digits(individual_digits=True), _split(_GPT2), _byte_level()]
    ),
    "llama-bpe": lambda: pre.Sequence([_split(_LLAMA3), _byte_level()]),
    "qwen2": lambda: pre.Sequence([_split(_QWEN2), _byte_level()]),
}


def _list(metadata: dict[str, Any], key: str, path: Any) -> Sequence[Any]:
    value = metadata.get(key)
    if value is None:
        raise ValueError(f"{path}: metadata {key} is missing: the file has no vocabulary")
    return value


class VocabStyle(enum.StrEnum):
    """The vocabulary styles read, by tokenizer.ggml.model's name (the module's docstring)."""

    GPT2 = "gpt2"
    LLAMA = "llama"


def vocab_style(metadata: Mapping[str, Any]) -> VocabStyle:
    """The file's vocabulary style, and for `gpt2` its pre-tokenizer, checked: a ValueError
    names the key where this reads neither."""
    style = metadata.get("tokenizer.ggml.model")
    styles = [s.value for s in VocabStyle]
    if not isinstance(style, str) or style not in styles:
        raise ValueError(
            f"tokenizer.ggml.model={style!r} is not supported: supported are {', '.join(styles)}"
        )
    pre_name = metadata.get("tokenizer.ggml.pre", "default")
    if style == VocabStyle.GPT2 and pre_name not in PRE_TOKENIZERS:
        raise ValueError(
            f"tokenizer.ggml.pre={pre_name!r} is not supported: supported are "
            f"{', '.join(PRE_TOKENIZERS)}"
        )
    return VocabStyle(style)


def _gpt2_model(tokens: Sequence[str], metadata: dict[str, Any], path: Any) -> Tokenizer:
    name = metadata.get("tokenizer.ggml.pre", "default")  # vocab_style checked it
    merges = [tuple(m.split(" ", 1)) for m in _list(metadata, "tokenizer.ggml.merges", path)]
    if any(len(m) != 2 for m in merges):
        raise ValueError(f"{path}: a tokenizer.ggml.merges entry is not two tokens")
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(
        models.BPE(vocab, merges, ignore_merges=name == "llama-bpe", fuse_unk=False)
    )
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[name]()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def spm_merges(tokens: Sequence[str], scores: np.ndarray, types: np.ndarray) -> list:
    """Every pair of pieces that makes another piece, most valuable result first: merging by
    these ranks is llama.cpp's SentencePiece rule (merge the pair whose joined piece scores
    highest, leftmost on ties)."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
    ranked = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-float(scores[i]), i, ids[left], (left, right)))
    ranked.sort()
    return [pair for *_, pair in ranked]


def _spm_model(tokens: Sequence[str], metadata: dict[str, Any], path: Any) -> Tokenizer:
    n = len(tokens)
    scores = np.asarray(metadata.get("tokenizer.ggml.scores", np.zeros(n)), dtype=np.float64)
    types = np.asarray(metadata.get("tokenizer.ggml.token_type", np.ones(n)), dtype=np.int64)
    if len(scores) != n or len(types) != n:
        raise ValueError(f"{path}: tokenizer.ggml.scores / token_type do not list every token")
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(
        models.BPE(
            vocab,
            spm_merges(tokens, scores, types),
            unk_token=tokens[int(unk)] if unk is not None and 0 <= int(unk) < n else None,
            byte_fallback=True,
            fuse_unk=True,
        )
    )
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    tokenizer.pre_tokenizer = pre.Metaspace(
        replacement="▁", prepend_scheme="always" if prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1 if prefix else 0, 0)])
    tokenizer.normalizer = normalizers.Sequence([])
    return tokenizer


def build_tokenizer(metadata: dict[str, Any], path: Any) -> Tokenizer:
    """The file's vocabulary as a `tokenizers` tokenizer (no BOS added: the caller decides)."""
    tokens = list(_list(metadata, "tokenizer.ggml.tokens", path))
    try:
        style = vocab_style(metadata)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    try:
        if style is VocabStyle.GPT2:
            tokenizer = _gpt2_model(tokens, metadata, path)
        else:
            tokenizer = _spm_model(tokens, metadata, path)
    except ValueError:
        raise
    except Exception as err:  # the `tokenizers` library's own (a merge of unknown tokens)
        raise ValueError(
            f"{path}: its vocabulary cannot be built ({err}): the tokenizer.ggml.tokens "
            "and merges do not agree; use another file"
        ) from err
    types = metadata.get("tokenizer.ggml.token_type")
    if types is not None and len(types) == len(tokens):
        kinds = [int(t) for t in types]
        # Control tokens are special (skipped when decoding); user-defined ones are text.
        tokenizer.add_special_tokens(
            [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(kinds)
                if t == CONTROL and tokens[i]
            ]
        )
        tokenizer.add_tokens(
            [
                AddedToken(tokens[i], special=False, normalized=False)
                for i, t in enumerate(kinds)
                if t == USER_DEFINED and tokens[i]
            ]
        )
    return tokenizer
