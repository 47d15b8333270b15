"""The sampler: the right distribution, greedy at T = 0, and draws that depend on nothing but
the request, its token index and its logits row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from pipeline.job.run import run
from pipeline.schema import GreedySamplerConf, RandomSamplerConf
from stages.sampling.sampler import GreedySampler, RandomSampler, uniforms
from stages.scheduling.request import Request, SamplingParams
from tests.helpers import make_config, schema_kwargs


def random_sampler(**given) -> RandomSampler:
    """A random sampler with the schema's defaults (seed: the top level's) and `given`."""
    return RandomSampler(**schema_kwargs(RandomSamplerConf, **given))


def greedy_sampler(**given) -> GreedySampler:
    return GreedySampler(**schema_kwargs(GreedySamplerConf, **given))


# ---------------------------------------------------------------------------------------------
# Helpers


def request(rid: str = "r", produced: int = 0, **sampling) -> Request:
    r = Request(id=rid, index=0, prompt="", prompt_ids=[1], max_new_tokens=1)
    r.output_ids = [0] * produced
    r.sampling = SamplingParams(**sampling)
    return r


def indexed(rid: str, index: int, **sampling) -> Request:
    """A request about to produce output token `index`; a range stands in for its output
    list, since only the list's length matters to the sampler and this keeps big draws cheap."""
    r = request(rid, **sampling)
    r.output_ids = range(index)  # type: ignore[assignment]
    return r


def sample(sampler, logits: np.ndarray, requests) -> np.ndarray:
    return sampler.sample(paddle.to_tensor(logits.astype(np.float32)), requests).token_ids


def draw_many(sampler, row: np.ndarray, n: int, by: str = "id", **sampling) -> np.ndarray:
    """n draws from one logits row: n request ids at token 0, or one id at tokens 0..n-1."""
    if by == "id":
        requests = [request(f"draw-{i}", **sampling) for i in range(n)]
    else:
        requests = [indexed("one", i, **sampling) for i in range(n)]
    return sample(sampler, np.tile(row, (n, 1)), requests)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def restricted(row: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """softmax(row / T) cut to top-k then top-p and renormalised, computed the plain way."""
    probs = softmax(row.astype(np.float64) / temperature)
    order = np.argsort(-row, kind="stable")
    if top_k:
        probs[order[top_k:]] = 0.0
        probs /= probs.sum()
    if top_p < 1:
        cumulative = np.cumsum(probs[order])
        size = int(np.searchsorted(cumulative, top_p * (1 - 1e-12))) + 1
        probs[order[size:]] = 0.0
    return probs / probs.sum()


# Upper 0.1% points of the chi-square distribution, from standard tables (NIST/SEMATECH
# e-Handbook of Statistical Methods, 1.3.6.7.4), used when scipy is not installed.
CHI2_999 = {
    1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124,
    9: 27.877, 10: 29.588, 11: 31.264, 12: 32.909, 13: 34.528, 14: 36.123, 15: 37.697,
}  # fmt: skip


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom over the tokens that can be drawn."""
    support = probs > 0
    expected = probs[support] * counts.sum()
    assert expected.min() >= 5, "too few draws for the chi-square approximation"
    stat = float((((counts[support] - expected) ** 2) / expected).sum())
    return stat, int(support.sum()) - 1


def fits(counts: np.ndarray, probs: np.ndarray) -> bool:
    """The goodness-of-fit test at the stated tolerance: p-value > 1e-3.

    The draws are fixed by their seeds, so the result is the same every run; 1e-3 leaves a
    correct sampler a 0.1% chance per case of having been unlucky when the case was written."""
    stat, dof = chi_square(counts, probs)
    if dof == 0:  # one possible token: drawing nothing else (checked by the caller) is a fit
        return True
    try:
        from scipy.stats import chi2
    except ImportError:
        return stat < CHI2_999[dof]
    return float(chi2.sf(stat, dof)) > 1e-3


def assert_distribution(tokens: np.ndarray, probs: np.ndarray) -> None:
    counts = np.bincount(tokens, minlength=len(probs)).astype(np.float64)
    assert counts[probs == 0].sum() == 0, "drew a token outside top-k / top-p"
    assert fits(counts, probs), (counts / counts.sum(), probs)


ROW = np.array([2.0, 1.5, 1.2, 1.0, 0.7, 0.5, 0.2, 0.0, -0.3, -0.8], dtype=np.float32)
DRAWS = 20_000

# ---------------------------------------------------------------------------------------------
# The distribution

DISTRIBUTIONS = {
    "temperature only": dict(temperature=0.7),
    "hot": dict(temperature=1.6),
    "top_k": dict(temperature=1.3, top_k=4),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "top_k and top_p": dict(temperature=0.9, top_k=6, top_p=0.7),
    "top_p below the first token's mass": dict(temperature=0.5, top_p=0.05),
}


@pytest.mark.parametrize("params", DISTRIBUTIONS.values(), ids=DISTRIBUTIONS.keys())
@pytest.mark.parametrize("by", ["id", "index"])
def test_frequencies_match_the_restricted_softmax(params, by):
    tokens = draw_many(random_sampler(seed=3, **params), ROW, DRAWS, by=by)
    assert_distribution(tokens, restricted(ROW, **params))


def test_per_request_values_override_the_sampler():
    params = dict(temperature=1.2, top_k=5, top_p=0.9)
    tokens = draw_many(random_sampler(temperature=0.3, top_k=2, seed=5), ROW, DRAWS, **params)
    assert_distribution(tokens, restricted(ROW, **params))


def test_the_test_can_fail():
    """Draws at T = 0.7 do not pass for softmax(logits), nor top-k draws for the full softmax."""
    counts = np.bincount(draw_many(random_sampler(temperature=0.7), ROW, DRAWS), minlength=10)
    assert not fits(counts.astype(np.float64), restricted(ROW, 1.0))
    top = draw_many(random_sampler(top_k=8), ROW, DRAWS)
    assert np.bincount(top, minlength=10)[8:].sum() == 0
    assert not fits(np.bincount(top, minlength=10).astype(np.float64), restricted(ROW, 1.0))


def test_large_vocabulary_top_p_beyond_the_candidate_head():
    """With a flat row the nucleus spans thousands of tokens, past the first candidates."""
    rng = np.random.default_rng(0)
    row = rng.normal(scale=0.1, size=4096).astype(np.float32)
    sampler = random_sampler(top_p=0.9, seed=1)
    requests = [request(f"wide-{i}") for i in range(64)]
    logits = np.tile(row, (64, 1))
    wide = sample(sampler, logits, requests)
    sampler.CANDIDATES = 1 << 20  # every row sorts its whole vocabulary
    assert np.array_equal(wide, sample(sampler, logits, requests))
    allowed = restricted(row, 1.0, top_p=0.9) > 0
    assert allowed.sum() > RandomSampler.CANDIDATES and allowed[wide].all()


def test_chi_square_table_matches_scipy():
    chi2 = pytest.importorskip("scipy.stats").chi2
    for dof, value in CHI2_999.items():
        assert chi2.isf(1e-3, dof) == pytest.approx(value, abs=1e-3)


# ---------------------------------------------------------------------------------------------
# Greedy


def tied_logits(rows: int = 16, vocab: int = 300) -> np.ndarray:
    """Random logits with exact ties at the top, where argmax conventions could differ."""
    rng = np.random.default_rng(7)
    x = rng.integers(-4, 5, size=(rows, vocab)).astype(np.float32)
    x[::2] += rng.normal(size=(rows // 2, vocab)).astype(np.float32)
    return x


GREEDY_EQUIVALENTS = {
    "temperature 0": (dict(temperature=0.0), {}),
    "top_k 1": (dict(temperature=1.5, top_k=1), {}),
    "tiny temperature": (dict(temperature=1e-6), {}),
    "per-request temperature 0": (dict(temperature=1.0), dict(temperature=0.0)),
    "per-request top_k 1": (dict(temperature=1.0, top_p=0.5), dict(top_k=1)),
}


@pytest.mark.parametrize(
    ("params", "sampling"), GREEDY_EQUIVALENTS.values(), ids=GREEDY_EQUIVALENTS
)
def test_greedy_equivalents_equal_greedy(params, sampling):
    x = tied_logits()
    requests = [request(f"g{i}", produced=i, **sampling) for i in range(len(x))]
    greedy = sample(greedy_sampler(), x, requests)
    assert np.array_equal(sample(random_sampler(seed=9, **params), x, requests), greedy)
    assert np.array_equal(greedy, np.argmax(x, axis=-1))  # lowest id among ties


# ---------------------------------------------------------------------------------------------
# Independence from batching

row_params = st.fixed_dictionaries(
    {
        "temperature": st.sampled_from([None, 0.0, 0.6, 1.0, 2.5]),
        "top_k": st.sampled_from([None, 0, 1, 2, 5, 40]),
        "top_p": st.sampled_from([None, 1.0, 0.95, 0.5, 0.1]),
        "seed": st.sampled_from([None, 0, 7, -3, 2**70]),
    }
)


@settings(max_examples=60, deadline=None)
@given(
    params=st.lists(row_params, min_size=1, max_size=12),
    vocab=st.sampled_from([3, 50, 1500]),
    data_seed=st.integers(0, 2**16),
    candidates=st.sampled_from([1, 4, 1024]),
)
def test_a_row_draws_the_same_alone_or_anywhere_in_a_batch(params, vocab, data_seed, candidates):
    rng = np.random.default_rng(data_seed)
    x = (rng.normal(size=(len(params), vocab)) * rng.uniform(0.1, 5)).astype(np.float32)
    x[:, : vocab // 3] = np.round(x[:, : vocab // 3])  # some exact ties
    requests = [request(f"b{i}", produced=i * 3, **p) for i, p in enumerate(params)]
    sampler = random_sampler(temperature=0.8, top_k=0, top_p=0.9, seed=11)
    sampler.CANDIDATES = candidates
    batch = sample(sampler, x, requests)

    alone = [sample(sampler, x[i : i + 1], [r])[0] for i, r in enumerate(requests)]
    assert batch.tolist() == alone

    order = rng.permutation(len(params))
    shuffled = sample(sampler, x[order], [requests[i] for i in order])
    assert shuffled.tolist() == batch[order].tolist()

    sampler.CANDIDATES = vocab  # one sort of the whole row: the same choices
    assert sample(sampler, x, requests).tolist() == batch.tolist()


def test_streams_depend_on_id_index_and_seed():
    x = np.zeros((1, 1000), dtype=np.float32)  # uniform: the token shows the stream
    sampler = random_sampler(seed=1)

    def token(rid, produced=0, sampler=sampler, **sampling):
        return int(sample(sampler, x, [request(rid, produced, **sampling)])[0])

    assert token("a") == token("a")
    assert len({token(f"id-{i}") for i in range(20)}) > 15
    assert len({token("a", produced=i) for i in range(20)}) > 15
    assert token("a") != token("a", sampler=random_sampler(seed=2))  # 1 in 1000 to collide
    # A request's own seed decides its stream, whatever its id or the run's seed.
    assert token("a", seed=5) == token("b", seed=5) == token("a", sampler=random_sampler(), seed=5)
    assert token("a", seed=5) != token("a", seed=6)


def test_uniforms_cover_the_unit_interval():
    u = uniforms(np.full(100_000, 12345, dtype=np.uint64), np.arange(100_000, dtype=np.uint64))
    assert 0 <= u.min() and u.max() < 1
    counts = np.bincount((u * 10).astype(int), minlength=10).astype(np.float64)
    assert fits(counts, np.full(10, 0.1))


# ---------------------------------------------------------------------------------------------
# Log-probabilities


@pytest.mark.parametrize(
    "sampler", [greedy_sampler(logprobs=3), random_sampler(temperature=2.0, logprobs=3)]
)
def test_logprobs_are_the_raw_top_k_and_hold_the_sampled_token(sampler):
    x = tied_logits(rows=8, vocab=40)
    requests = [request(f"l{i}") for i in range(len(x))]
    samples = sampler.sample(paddle.to_tensor(x), requests)
    assert samples.logprobs is not None and len(samples.logprobs) == len(x)
    for row, token, entry in zip(x, samples.token_ids, samples.logprobs, strict=True):
        raw = np.log(softmax(row.astype(np.float64)))  # before temperature
        top = np.argsort(-row, kind="stable")[:3]
        assert set(top.tolist()) <= set(entry) <= set(top.tolist()) | {int(token)}
        for tid, value in entry.items():
            assert value == pytest.approx(raw[tid], abs=1e-9)


def test_no_logprobs_by_default():
    x = tied_logits(rows=2, vocab=10)
    for sampler in (greedy_sampler(), random_sampler()):
        assert sampler.sample(paddle.to_tensor(x), [request("a"), request("b")]).logprobs is None


# ---------------------------------------------------------------------------------------------
# Validation

BAD_CONFIG = {
    "negative temperature": (dict(temperature=-1.0), "sampler.temperature=-1.0 must be >= 0"),
    "top_p zero": (dict(top_p=0.0), "sampler.top_p=0.0 must be in (0, 1]"),
    "top_p above one": (dict(top_p=1.5), "sampler.top_p=1.5 must be in (0, 1]"),
    "negative top_k": (dict(top_k=-2), "sampler.top_k=-2 must be >= 0"),
    "negative logprobs": (dict(logprobs=-1), "sampler.logprobs=-1 must be an integer >= 0"),
}


@pytest.mark.parametrize(("params", "message"), BAD_CONFIG.values(), ids=BAD_CONFIG.keys())
def test_bad_sampler_values_fail_with_one_line(params, message):
    with pytest.raises(ValueError) as err:
        random_sampler(**params)
    assert message in str(err.value) and "set sampler." in str(err.value)
    assert "\n" not in str(err.value)


def test_greedy_checks_logprobs():
    with pytest.raises(ValueError, match="sampler.logprobs=-3"):
        greedy_sampler(logprobs=-3)


BAD_REQUEST = {
    "negative temperature": (dict(temperature=-1), "temperature=-1 must be >= 0"),
    "temperature not a number": (dict(temperature="hot"), "temperature='hot' must be a finite"),
    "infinite temperature": (dict(temperature=float("inf")), "temperature=inf must be a finite"),
    "top_p zero": (dict(top_p=0), "top_p=0 must be in (0, 1]"),
    "top_p above one": (dict(top_p=1.01), "top_p=1.01 must be in (0, 1]"),
    "negative top_k": (dict(top_k=-1), "top_k=-1 must be >= 0"),
    "fractional top_k": (dict(top_k=2.5), "top_k=2.5 must be an integer >= 0"),
    "boolean top_k": (dict(top_k=True), "top_k=True must be an integer >= 0"),
    "seed not an integer": (dict(seed="7"), "seed='7' must be an integer"),
}


@pytest.mark.parametrize(("sampling", "message"), BAD_REQUEST.values(), ids=BAD_REQUEST.keys())
def test_bad_request_values_are_that_requests_error(sampling, message):
    for sampler in (random_sampler(), greedy_sampler()):
        error = sampler.validate_request(request(**sampling))
        assert error is not None and error.startswith(message) and "\n" not in error
        assert sampler.validate_request(request(temperature=0.6, top_k=3, top_p=1, seed=1)) is None


def test_bad_config_is_a_config_error():
    with pytest.raises(ConfigError, match=r"sampler.top_p=0.0 must be in \(0, 1\]"):
        build_engine(make_config(["sampler=random", "sampler.top_p=0"]))


@pytest.mark.slow
def test_bad_config_is_one_line_on_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", f"hydra.run.dir={tmp_path}", "sampler=random"]
        + ["sampler.temperature=-0.5"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode != 0
    assert "sampler.temperature=-0.5 must be >= 0" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# End to end: the real pipeline, read back from generations.jsonl

# Long enough outputs that a small pool must preempt; max_tokens and the pool change only how
# the work is split, so every request's tokens must come out the same.
GROW = [
    "sampler=random",
    "workload.num_requests=8",
    "workload.min_new_tokens=20",
    "workload.max_new_tokens=40",
]


def generations(tmp_path: Path, overrides: list[str]) -> tuple[dict[str, list[int]], dict]:
    out = tmp_path / "_".join(o.replace("=", "-").replace("/", "-") for o in overrides)
    out.mkdir()
    metrics = run(make_config([*GROW, *overrides]), out)
    assert metrics["status"] == "ok" and metrics["num_errors"] == 0
    lines = [json.loads(line) for line in (out / "generations.jsonl").open()]
    return {g["id"]: g["output_ids"] for g in lines}, metrics


SPLITS = {
    "budget 512": ["max_tokens=512"],
    "budget 4096": ["max_tokens=4096"],
    "preemption": ["max_tokens=64", "num_blocks=10"],
    "whole prompts": ["scheduler=whole", "max_tokens=4096"],
    "exponential buckets": ["metadata.bucketing=exponential", "max_tokens=48"],
}


@pytest.fixture(scope="module")
def budget_64(tmp_path_factory):
    return generations(tmp_path_factory.mktemp("sampled"), ["max_tokens=64"])[0]


@pytest.mark.parametrize("overrides", SPLITS.values(), ids=SPLITS.keys())
def test_sampled_outputs_do_not_depend_on_batching(tmp_path, budget_64, overrides):
    got, metrics = generations(tmp_path, overrides)
    if "num_blocks=10" in overrides:
        assert metrics["num_preemptions"] >= 2, "the pool did not force preemption"
    assert got == budget_64


def test_sampled_outputs_are_sampled(tmp_path, budget_64):
    """The comparison above can fail: greedy or another seed gives other tokens."""
    greedy, _ = generations(tmp_path, ["sampler=greedy", "max_tokens=64"])
    reseeded, _ = generations(tmp_path, ["max_tokens=64", "sampler.seed=1"])
    for other in (greedy, reseeded):
        assert sum(other[rid] != budget_64[rid] for rid in budget_64) >= 6


def test_jsonl_lines_override_and_fail_alone(tmp_path):
    lines = [
        {"id": "a", "prompt": "the block cache", "max_new_tokens": 12, "seed": 42},
        {"id": "b", "prompt": "the block cache", "max_new_tokens": 12, "seed": 42},
        {"id": "c", "prompt": "the block cache", "max_new_tokens": 12, "temperature": 0},
        {"id": "bad", "prompt": "the block cache", "top_p": 1.5},
        {"id": "d", "prompt": "the block cache", "max_new_tokens": 12, "top_k": 1},
    ]
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "run"
    out.mkdir()
    overrides = ["workload=jsonl", f"workload.path={path}", "sampler=random", "sampler.logprobs=2"]
    run(make_config([*overrides, "max_tokens=64"]), out)
    got = {g["id"]: g for g in map(json.loads, (out / "generations.jsonl").open())}

    assert got["bad"]["finish_reason"] == "error"
    assert got["bad"]["error"] == "top_p=1.5 must be in (0, 1] (1.0 = off)"
    assert all(got[rid]["error"] is None for rid in "abcd")
    assert got["a"]["output_ids"] == got["b"]["output_ids"]  # same prompt and seed
    assert got["c"]["output_ids"] == got["d"]["output_ids"]  # both greedy
    assert got["a"]["output_ids"] != got["c"]["output_ids"]
    for rid in "abcd":
        g = got[rid]
        assert len(g["logprobs"]) == len(g["output_ids"])
        for token, entry in zip(g["output_ids"], g["logprobs"], strict=True):
            assert str(token) in entry and 2 <= len(entry) <= 3
