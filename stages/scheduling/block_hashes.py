"""Block identities for prefix caching: a full block's content hash covers its parent
block's hash and its own token ids (so equal hashes mean an equal whole prefix), and a
trace's drawn prompt is known by a name of each prefix instead (its stream's key and length:
equal names, equal ids), so a run of a trace hashes no prompt ids and draws none.

The KV-cache manager only looks these up (stages.scheduling.kv_cache); making them lives here.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from hashlib import blake2b

import numpy as np

from stages.scheduling.request import PromptIds, Request


def chain_hash(parent: bytes, token_bytes: bytes) -> bytes:
    """A block's content hash: its parent's hash and its token ids' bytes (int32), by
    blake2b."""
    return blake2b(parent + token_bytes, digest_size=16).digest()


ROOT_HASH = b""  # the parent of a sequence's first block
NAMED_PROMPT = b"named prompt"  # blake2b's personalisation for a block a prompt's name starts


def int32_bytes(ids: Sequence[int]) -> bytes:
    """Token ids' bytes as int32 in the machine's order, as an int32 array's: packing a
    list costs a fraction of making an array of it first."""
    return struct.pack(f"={len(ids)}i", *ids)


def token_bytes(request: Request, start: int, end: int) -> bytes:
    """The request's token ids start..end-1 as int32 bytes, prompt then output, without
    joining the whole sequence first (a long prompt's ids may be made on demand)."""
    prompt = request.prompt_ids
    num_prompt = request.num_prompt_tokens
    data = b""
    if start < num_prompt:
        # A trace's drawn prompt gives an array slice; making its list first costs more.
        stop = end if end < num_prompt else num_prompt
        if isinstance(prompt, PromptIds):
            data = np.asarray(prompt.array(start, stop), dtype=np.int32).tobytes()
        else:
            data = int32_bytes(prompt[start:stop])
    if end > num_prompt:
        first = start - num_prompt if start > num_prompt else 0
        data += int32_bytes(request.output_ids[first : end - num_prompt])
    return data


class BlockHasher:
    """Makes each request's block identities once and keeps them on the request
    (`request.block_hashes`), up to the blocks asked for."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # The bytes of a block of one token over and over, and the token (see _ids_bytes).
        self._repeated: tuple[int | None, bytes] = (None, b"")

    def hashes_to(self, request: Request, num_blocks: int) -> list[bytes]:
        """The request's kept hashes, made up to at least its first num_blocks blocks."""
        chain = request.block_hashes
        have = len(chain)
        if have >= num_blocks:  # (admission asks again while a request waits)
            return chain
        bs, num_prompt = self.block_size, request.num_prompt_tokens
        if have * bs < num_prompt:
            prompt = request.prompt_ids
            # (A list is no PromptIds: asking the abstract class costs a call.)
            if type(prompt) is not list and isinstance(prompt, PromptIds):
                self._named_blocks(request, prompt, num_blocks)
                have = len(chain)
                if have >= num_blocks:  # (admission: the prompt's whole blocks)
                    return chain
            if have * bs < num_prompt:  # a list, or a prompt known by its content only
                self._content_blocks(request, num_blocks)
                return chain
        # The common case, a decode's block: whole blocks of output ids.
        output = request.output_ids
        parent = chain[-1] if chain else ROOT_HASH
        start = have * bs - num_prompt
        for _ in range(num_blocks - have):
            data = self._ids_bytes(output[start : start + bs])
            parent = chain_hash(parent, data)
            chain.append(parent)
            start += bs
        return chain

    def _ids_bytes(self, ids: list[int]) -> bytes:
        """int32_bytes of up to a block's ids. A simulated device samples one token over
        and over: a block of it is packed once, and each block of it cut from that (packing
        a block costs as much as hashing it)."""
        token = ids[0]
        if ids.count(token) != len(ids):
            return int32_bytes(ids)
        if self._repeated[0] != token:
            self._repeated = (token, int32_bytes([token] * self.block_size))
        return self._repeated[1][: 4 * len(ids)]

    def _content_blocks(self, request: Request, num_blocks: int) -> None:
        """Appends the content hashes of the request's blocks up to num_blocks, each from its
        parent's and its token ids."""
        chain, bs = request.block_hashes, self.block_size
        have = len(chain)
        data = token_bytes(request, have * bs, num_blocks * bs)
        width = bs * 4  # bytes of a block's int32 ids
        parent = chain[-1] if chain else ROOT_HASH
        for j in range(num_blocks - have):
            parent = chain_hash(parent, data[j * width : (j + 1) * width])
            chain.append(parent)

    def _named_blocks(self, request: Request, prompt: PromptIds, num_blocks: int) -> None:
        """Appends the identities of the request's first num_blocks blocks that lie in its
        prompt: a whole block's is the name of the prefix it ends, and the block the prompt
        ends in (its output tokens after it) is hashed from the prompt's name and those
        tokens, apart from content hashes (another personalisation)."""
        chain, bs = request.block_hashes, self.block_size
        num_prompt = request.num_prompt_tokens
        whole = num_prompt // bs
        whole = whole if whole < num_blocks else num_blocks
        have = len(chain)
        if have < whole:
            names = prompt.prefix_keys(range((have + 1) * bs, (whole + 1) * bs, bs))
            if names is None:
                return
            chain += names
            have = whole
        if have == whole < num_blocks and num_prompt % bs:
            names = prompt.prefix_keys((num_prompt,))
            if names is None:
                return
            data = names[0] + self._ids_bytes(request.output_ids[: (whole + 1) * bs - num_prompt])
            chain.append(blake2b(data, digest_size=16, person=NAMED_PROMPT).digest())
