"""Turns each row of logits into the next token.

Randomness is counter-based: a request's draw for its output token i is a hash of (the run's
seed, the request's id) -- or of the request's own seed -- and i. Nothing is carried from step
to step, so a request's tokens do not depend on which other requests shared its steps, on
chunking or bucketing, on max_tokens, or on preemption (recompute re-derives the same draws).

Reported log-probabilities are the log-softmax of the raw logits: before temperature, top-k
and top-p, so they describe the model rather than the sampling settings (vLLM's default).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import TypeGuard

import numpy as np
import paddle

from stages.sampling.logprobs import asked_counts, entries
from stages.sampling.token_ranking import rank_keys, top_indices
from stages.scheduling.request import TOP_K_MAX, Request, Samples

# ---------------------------------------------------------------------------------------------
# Counter-based uniforms

_MASK64 = (1 << 64) - 1
# Domain tags keep id-derived and seed-derived streams apart even for equal numbers.
_ID_STREAM = 0x5EED_1D00_0000_0001
_SEED_STREAM = 0x5EED_5EED_0000_0002


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 arrays: a bijection with good avalanche.

    numpy's uint64 arithmetic wraps modulo 2**64 for arrays, which is what the mix needs."""
    z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


# Cached for the rows in flight, hashed once each rather than at every token; a server's
# ids never come back, so a larger cache would only grow (~200 bytes an id) to its size.
@functools.lru_cache(maxsize=1 << 12)
def id_hash(request_id: str) -> int:
    """A stable 64-bit hash of an id (Python's hash() changes from run to run)."""
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little")


def stream_keys(
    base_seed: int, request_ids: Sequence[str], request_seeds: Sequence[int | None]
) -> np.ndarray:
    """The 64-bit key of each request's stream, [rows] uint64.

    A request's own seed alone decides its stream, so a line with `seed` reproduces under any
    run seed; otherwise the run's seed and the request's id do."""
    base = splitmix64(np.array([(base_seed & _MASK64) ^ _ID_STREAM], dtype=np.uint64))
    by_id = splitmix64(base ^ np.array([id_hash(i) for i in request_ids], dtype=np.uint64))
    own = np.array([s is not None for s in request_seeds], dtype=bool)
    seeds = np.array([(s or 0) & _MASK64 for s in request_seeds], dtype=np.uint64)
    by_seed = splitmix64(seeds ^ np.uint64(_SEED_STREAM))
    return np.where(own, by_seed, by_id)


def uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per (stream key, counter) pair, float64 with 53 random bits."""
    mixed = splitmix64(np.asarray(keys, dtype=np.uint64) ^ splitmix64(counters))
    return (mixed >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


# ---------------------------------------------------------------------------------------------
# Ordering and log-probabilities shared by both samplers


def argmax(logits: np.ndarray) -> np.ndarray:
    """The most likely token of each row; the lowest id among ties, as in the sort order."""
    return np.argmax(logits, axis=-1).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Validation: one message naming the key and what to set


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, Integral) and not isinstance(value, bool)


def temperature_error(value: object, key: str) -> str | None:
    if not _is_number(value) or not math.isfinite(value):
        return f"{key}={value!r} must be a finite number >= 0"
    if value < 0:
        return f"{key}={value} must be >= 0 (0 = greedy)"
    return None


def top_k_error(value: object, key: str) -> str | None:
    if not _is_int(value):
        return f"{key}={value!r} must be an integer >= 0 (0 = off)"
    if value < 0:
        return f"{key}={value} must be >= 0 (0 = off)"
    if value > TOP_K_MAX:
        return f"{key}={value} must be at most {TOP_K_MAX} (0 = off)"
    return None


def top_p_error(value: object, key: str) -> str | None:
    if not _is_number(value) or not 0 < value <= 1:
        return f"{key}={value!r} must be in (0, 1] (1.0 = off)"
    return None


def seed_error(value: object, key: str) -> str | None:
    if not _is_int(value):
        return f"{key}={value!r} must be an integer"
    return None


def logprobs_error(value: object, key: str) -> str | None:
    if not _is_int(value) or value < 0:
        return f"{key}={value!r} must be an integer >= 0 (0 = off)"
    return None


def request_error(request: Request) -> str | None:
    """The first bad per-request sampling value, named as in the jsonl line."""
    s = request.sampling
    checks = (
        (s.temperature, temperature_error, "temperature"),
        (s.top_k, top_k_error, "top_k"),
        (s.top_p, top_p_error, "top_p"),
        (s.seed, seed_error, "seed"),
        (s.logprobs, logprobs_error, "logprobs"),
        (s.prompt_logprobs, logprobs_error, "prompt_logprobs"),
    )
    for value, check, key in checks:
        if value is not None:
            message = check(value, key)
            if message:
                return message
    return None


def _raise_if(message: str | None, fix: str) -> None:
    if message:
        raise ValueError(f"{message}: {fix}")


# ---------------------------------------------------------------------------------------------
# Samplers


class GreedySampler:
    """Takes the most likely token of every row.

    Per-request temperature, top_k, top_p and seed do not change its choice; they are still
    checked, so a bad line is an error under every sampler."""

    def __init__(self, logprobs: int) -> None:
        _raise_if(logprobs_error(logprobs, "sampler.logprobs"), "set sampler.logprobs=0 or a count")
        self.logprobs = int(logprobs)

    def validate_request(self, request: Request) -> str | None:
        return request_error(request)

    def sample(self, logits: paddle.Tensor, requests: Sequence[Request]) -> Samples:
        counts = asked_counts(requests, self.logprobs)
        if counts is None:
            # Only the [rows] argmax leaves the device, not the whole [rows, vocab] logits.
            return Samples(paddle.argmax(logits, axis=-1).numpy().astype(np.int64))
        x = logits.numpy()
        tokens = argmax(x)
        return Samples(tokens, entries(x, tokens, counts))


GREEDY_BELOW = 1e-5  # temperatures below this take the argmax


class RandomSampler:
    """Temperature, top-k and top-p sampling with a counter-based stream per request.

    For each row: scale the logits by 1/T, keep the k most likely tokens (top_k, 0 = off),
    renormalise, of those keep the smallest most-likely set whose probability reaches top_p
    (1.0 = off; always at least one token), renormalise again, and take the token where the
    row's uniform falls in the cumulative distribution. T = 0 (below 1e-5) or top_k = 1 is
    the argmax."""

    # Rows without a top_k first look at this many candidates; a row whose top_p mass is not
    # reached within them falls back to sorting its whole vocabulary. The choice is the same
    # either way, since the candidates are the head of the same total order.
    CANDIDATES = 1024

    def __init__(
        self,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
        logprobs: int,
    ) -> None:
        _raise_if(
            temperature_error(temperature, "sampler.temperature"),
            "set sampler.temperature=0 for greedy or a positive value such as 0.6",
        )
        _raise_if(
            top_k_error(top_k, "sampler.top_k"),
            "set sampler.top_k=0 (off) or a positive count such as 50",
        )
        _raise_if(
            top_p_error(top_p, "sampler.top_p"),
            "set sampler.top_p=1.0 (off) or a value such as 0.95",
        )
        _raise_if(seed_error(seed, "sampler.seed"), "set sampler.seed to an integer")
        _raise_if(logprobs_error(logprobs, "sampler.logprobs"), "set sampler.logprobs=0 or a count")
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.logprobs = int(logprobs)

    def validate_request(self, request: Request) -> str | None:
        return request_error(request)

    def row_params(
        self, requests: Sequence[Request]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per row: temperature, top_k, top_p and the uniform for its next output token."""
        temperature, top_k, top_p = [], [], []
        for r in requests:
            s = r.sampling
            temperature.append(self.temperature if s.temperature is None else s.temperature)
            top_k.append(self.top_k if s.top_k is None else s.top_k)
            top_p.append(self.top_p if s.top_p is None else s.top_p)
        keys = stream_keys(self.seed, [r.id for r in requests], [r.sampling.seed for r in requests])
        counters = np.array([len(r.output_ids) for r in requests], dtype=np.uint64)
        return (
            np.array(temperature, dtype=np.float64),
            np.array(top_k, dtype=np.int64),
            np.array(top_p, dtype=np.float64),
            uniforms(keys, counters),
        )

    def sample(self, logits: paddle.Tensor, requests: Sequence[Request]) -> Samples:
        x = logits.numpy()
        if x.shape[0] != len(requests):
            raise ValueError(f"{x.shape[0]} logits rows for {len(requests)} requests")
        temperature, top_k, top_p, u = self.row_params(requests)
        vocab = x.shape[-1]
        top_k = np.where((top_k <= 0) | (top_k >= vocab), 0, top_k)  # 0: no top-k cut

        tokens = argmax(x)
        # Like vLLM, a temperature this small is greedy: 1/T would overflow the scaled logits.
        random = (temperature >= GREEDY_BELOW) & (top_k != 1)
        if random.any():
            rows = np.flatnonzero(random)
            tokens[rows] = filtered_draw(
                x[rows], temperature[rows], top_k[rows], top_p[rows], u[rows], self.CANDIDATES
            )
        counts = asked_counts(requests, self.logprobs)
        return Samples(tokens, entries(x, tokens, counts) if counts is not None else None)


def filtered_draw(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    u: np.ndarray,
    candidates: int = RandomSampler.CANDIDATES,
) -> np.ndarray:
    """Inverse-CDF draws from softmax(logits / T) cut to top-k and top-p, for every row at once.

    top_k is 0 (off) or in [2, vocab); temperature >= 1e-5; u in [0, 1). Which path a row takes
    depends on its own values only, so its token never depends on the other rows."""
    vocab = logits.shape[-1]
    scaled = logits.astype(np.float64) / temperature[:, None]
    peak = scaled.max(axis=-1, keepdims=True)
    lse = peak + np.log(np.exp(scaled - peak).sum(axis=-1, keepdims=True))  # over the whole row
    tokens = np.empty(len(logits), dtype=np.int64)

    # A row with neither cut draws from the whole distribution in token-id order: no sort.
    plain = (top_k == 0) & (top_p >= 1)
    rows = np.flatnonzero(plain)
    if rows.size:
        mass = np.cumsum(np.exp(scaled[rows] - lse[rows]), axis=-1)
        tokens[rows] = _invert(mass, u[rows], np.full(rows.size, vocab - 1))

    # A top_k row needs only its k best; a top_p row first tries the candidate head and falls
    # back to its whole sorted vocabulary when top_p is not reached within it.
    rows = np.flatnonzero(~plain)
    if rows.size:
        keys = rank_keys(logits[rows])  # the order of logits / T for any T > 0
        unbounded = (top_k[rows] == 0).any()
        count = min(vocab, max(int(top_k[rows].max()), candidates if unbounded else 0))
        picked, covered = _draw_sorted(
            scaled[rows], lse[rows], keys, top_k[rows], top_p[rows], u[rows], count
        )
        tokens[rows[covered]] = picked[covered]
        short = ~covered
        if short.any():
            picked, _ = _draw_sorted(
                scaled[rows[short]],
                lse[rows[short]],
                keys[short],
                top_k[rows[short]],
                top_p[rows[short]],
                u[rows[short]],
                vocab,
            )
            tokens[rows[short]] = picked
    return tokens


def _invert(mass: np.ndarray, u: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per row, the first position whose cumulative mass exceeds u times the kept mass.

    Scaling the uniform by the kept mass is renormalising the kept distribution; `last` (the
    last kept position) guards against u * total rounding up to total."""
    total = np.take_along_axis(mass, last[:, None], axis=-1)
    return np.minimum((mass <= u[:, None] * total).sum(axis=-1), last)


def _draw_sorted(
    scaled: np.ndarray,
    lse: np.ndarray,
    keys: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    u: np.ndarray,
    count: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Draws among each row's `count` most likely tokens; also says for which rows that head
    holds the whole kept set (always so when count is the vocabulary size).

    The head is a prefix of one total order and the cumulative sum is sequential, so a row
    draws the same token from any head that holds its kept set."""
    vocab = scaled.shape[-1]
    order = top_indices(keys, count)  # [rows, count], most likely first
    probs = np.exp(np.take_along_axis(scaled, order, axis=-1) - lse)
    mass = np.cumsum(probs, axis=-1)
    before = np.concatenate([np.zeros((len(mass), 1)), mass[:, :-1]], axis=-1)
    # Top-p applies to the top-k set renormalised, as in vLLM and Hugging Face: its mass is
    # the share of the k best tokens' mass (of the whole row's without top-k).
    k_mass = np.where(top_k > 0, mass[np.arange(len(mass)), np.maximum(top_k, 1) - 1], 1.0)
    # Top-p keeps a token while the mass before it is below top_p: the smallest most-likely
    # set reaching top_p, never empty. top_p = 1 is off, so rounding cannot cut the tail.
    keep = (top_p[:, None] >= 1) | (before < (top_p * k_mass)[:, None])
    keep &= (top_k[:, None] == 0) | (np.arange(count) < top_k[:, None])
    covered = (count >= vocab) | (top_k > 0) | ((top_p < 1) & (mass[:, -1] >= top_p))
    chosen = _invert(mass, u, keep.sum(axis=-1) - 1)  # keep is a prefix of each row
    return np.take_along_axis(order, chosen[:, None], axis=-1)[:, 0], covered
