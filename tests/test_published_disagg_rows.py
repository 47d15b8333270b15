"""The published disaggregated latency rows as data: each parses, names its source and the
engine profile of the release it ran, and composes into the closed-loop deployment it
states (its pools' cards, block size, scheduler, concurrency); only vLLM 0.6.3's rows fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.disagg_latency import LATENCY, latency_overrides
from benchmarks.published_disagg import read_rows
from pipeline.disagg.config import deployment_cards
from pipeline.executors import check_config
from tests.helpers import make_config

ROWS = read_rows(LATENCY)
PROFILES = {path.stem for path in (Path(__file__).resolve().parents[1] / "conf/engine").glob("*")}


def test_every_row_has_a_source_a_role_and_a_known_engine_profile() -> None:
    assert len({row["id"] for row in ROWS}) == len(ROWS)
    for row in ROWS:
        assert len(row["source"]) > 40, row["id"]  # a citation, not a word
        assert row["role"] in ("fit", "held_out"), row["id"]
        assert row["profile"] in PROFILES, row["id"]
        assert float(row["ttft_ms"]) > 0 and float(row["itl_ms"]) > 0, row["id"]
        # TTFT holds at least one step; a step is longer than nothing
        assert float(row["ttft_ms"]) > float(row["itl_ms"]), row["id"]
    # The profile fitted is vLLM 0.6.3's: every fit row ran it.
    assert {row["profile"] for row in ROWS if row["role"] == "fit"} == {"vllm_v0"}


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_each_row_composes_into_the_deployment_it_states(row: dict[str, str]) -> None:
    cfg = make_config(latency_overrides(row))
    check_config(cfg)
    pools = int(row["prefill"]) * int(row["prefill_tp"]) + int(row["decode"]) * int(
        row["decode_tp"]
    )
    cards = pools if row["kind"] == "disaggregated" else int(row["tp"])
    assert deployment_cards(cfg) == cards
    assert (cfg.block_size, cfg.max_model_len, cfg.max_tokens, cfg.max_num_seqs) == (
        int(row["block_size"]),
        int(row["max_model_len"]),
        int(row["max_batched_tokens"]),
        int(row["max_num_seqs"]),
    )
    assert cfg.workload.concurrency == int(row["concurrency"])
    assert cfg.workload.num_requests == int(row["requests"])


def test_a_row_without_the_optional_columns_takes_the_configs_defaults() -> None:
    """A latency file with only the first columns (no engine profile, scheduler, limits,
    router or role) still composes: each missing setting stays at the config's default."""
    row = {"id": "x", "kind": "disaggregated", "hardware": "h100", "model": "llama31_8b",
           "quantization": "none", "input_tokens": "1000", "output_tokens": "100",
           "concurrency": "8", "requests": "16", "prefill": "2", "prefill_tp": "1",
           "decode": "1", "decode_tp": "1", "tp": "0", "engine": "vllm"}  # fmt: skip
    overrides = latency_overrides(row)
    assert not any(o.split("=")[0] in ("engine", "scheduler", "block_size") for o in overrides)
    cfg = make_config(overrides)
    check_config(cfg)
    default = make_config(["executor=simulated", "hardware=h100", "model=spec/llama31_8b"])
    assert (cfg.block_size, cfg.max_tokens, cfg.disagg.router) == (
        default.block_size, default.max_tokens, "round_robin"
    )  # fmt: skip
