"""Prefill/decode disaggregation on the simulated device: the KV transfer against a hand
computation (bytes and pieces), the prefill instances' first tokens against an aggregated
prefill-only run, a lone request's tokens against an aggregated run's, its TTFT's parts
adding up, closed-loop load against its bound and against the open loop, the pools'
checks, and
the property DistServe (arXiv:2401.09670) and Splitwise (arXiv:2311.18677) report: under
tight TTFT and TPOT bounds, long prompts serve more goodput per card disaggregated, short
prompts less."""

from __future__ import annotations

import pytest

from benchmarks.disagg_latency import LatencyCheck, latency_overrides, transfer_ms
from benchmarks.published_disagg import checked_errors
from pipeline.config.checks import ConfigError, describe_model
from pipeline.disagg.config import deployment_cards, pool_cfg
from pipeline.disagg.deployment import build_deployment, serve_deployment, simulate
from pipeline.disagg.latency import ttft_parts_s
from pipeline.executors import build_engine, check_config
from pipeline.executors.build import build
from pipeline.job.slo import Slo
from pipeline.plan.capacity import capacity_search
from stages.model.spec import ModelSpec
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request, Status
from stages.scheduling.scheduler import ChunkedScheduler
from stages.scheduling.stopping import StopRule
from stages.simulator.disagg_engines import DISAGG_ENGINES
from stages.simulator.disaggregation import (
    KvLayout,
    KvLink,
    LinkSettings,
    kv_bytes_per_token,
    kv_link,
)
from stages.simulator.hardware import HardwareProfile
from stages.simulator.precision import BF16, Precision
from tests.helpers import make_config

BASE = [
    "executor=simulated",
    "hardware=h100",
    "model=spec/llama31_8b",
    "warmup=true",
    "max_model_len=8192",
    "max_num_seqs=16",
    "max_tokens=2048",
]


def llama_8b_shape() -> ModelSpec:
    return describe_model(make_config(BASE))[0]


def test_the_kv_transfer_takes_the_prompts_bytes_over_the_link_plus_its_latency():
    spec = llama_8b_shape()
    # Llama 3.1 8B: 32 layers, 8 KV heads of 128, bf16: 2 x 8 x 128 x 2 x 32 bytes a token.
    assert kv_bytes_per_token(spec, BF16, 1) == 131072
    # At tp 2 each device holds 4 KV heads, and sends its half over its own link.
    assert kv_bytes_per_token(spec, BF16, 2) == 65536
    link = KvLink(65536, 50e9, 0.001)  # no pieces
    assert link.seconds(1000) == pytest.approx(1000 * 65536 / 50e9 + 0.001)
    # 1000 tokens in blocks of 128: 8 blocks x 32 layers x (K, V) = 512 pieces of 2 us.
    link = KvLink(65536, 50e9, 0.001, 2e-6, KvLayout(128, 32))
    assert link.seconds(1000) == pytest.approx(1000 * 65536 / 50e9 + 512 * 2e-6 + 0.001)
    # An fp8 KV cache sends one byte a value.
    assert kv_bytes_per_token(spec, Precision("none", "fp8"), 1) == 65536


def test_the_link_is_the_profiles_unless_the_keys_set_it():
    cfg = make_config(BASE)
    spec = describe_model(cfg)[0]
    h100: HardwareProfile = build(cfg.hardware)
    assert (h100.kv_link_gbs, h100.kv_link_latency_s) == (50, 0.001)  # 400 Gb/s NDR
    link = kv_link(spec, h100, BF16, (1, 1), 128)
    assert (link.bytes_per_s, link.latency_s, link.piece_s) == (50e9, 0.001, 2e-6)
    link = kv_link(spec, h100, BF16, (1, 1), 128, LinkSettings(450, 0.0, 0.0))
    assert (link.bytes_per_s, link.latency_s, link.piece_s) == (450e9, 0.0, 0.0)


def test_a_transfers_time_grows_as_its_pages_shrink():
    spec = llama_8b_shape()
    h100: HardwareProfile = build(make_config(BASE).hardware)
    times = [kv_link(spec, h100, BF16, (1, 1), bs).seconds(7500) for bs in (256, 128, 64, 16)]
    assert times == sorted(times) and times[-1] > times[0]
    # 7,500 tokens in pages of 16: 469 x 32 layers x 2 pieces more than in one piece each.
    bytes_s = 7500 * 131072 / 50e9
    assert times[-1] == pytest.approx(bytes_s + 469 * 64 * 2e-6 + 0.001)


def test_the_kv_layouts_tps_decide_the_busiest_links_bytes_and_pieces():
    spec = llama_8b_shape()
    h100: HardwareProfile = build(make_config(BASE).hardware)
    blocks = 8 * 32 * 2  # 1000 tokens: 8 blocks of 128 a layer, keys and values apart
    # A wider decode pool: each decode device pulls half of one prefill device's heads.
    wide = kv_link(spec, h100, BF16, (1, 2), 128)
    assert (wide.bytes_per_token, wide.layout.pieces(1000)) == (131072, blocks)
    # A narrower one: each decode device gathers two prefill devices' heads, twice the pieces.
    narrow = kv_link(spec, h100, BF16, (2, 1), 128)
    assert (narrow.bytes_per_token, narrow.layout.pieces(1000)) == (131072, 2 * blocks)
    even = kv_link(spec, h100, BF16, (2, 2), 128)
    assert (even.bytes_per_token, even.layout.pieces(1000)) == (65536, blocks)


SMALL = [
    *BASE,
    "workload.num_requests=24",
    "workload.rate=20",
    "workload.min_prompt_tokens=200",
    "workload.max_prompt_tokens=1500",
    "workload.min_new_tokens=4",
    "workload.max_new_tokens=40",
]


def test_the_prefill_instances_token_is_an_aggregated_prefill_only_runs_after_the_hop():
    cfg = make_config([*SMALL, "disagg.prefill=1", "disagg.decode=2", "disagg.prefill_tp=2",
                       "disagg.router_s=0.004"])  # fmt: skip
    deployment = build_deployment(cfg)
    simulate(deployment)
    # The oracle: the same requests, one output token each, on one aggregated instance
    # with the prefill pool's tp, each sent 4 ms later (the router's hop).
    engine, requests = build_engine(make_config([*SMALL, "tp=2"]))
    for r in requests:
        r.max_new_tokens = 1
        r.arrival_s += 0.004
    engine.warmup()
    engine.run(requests)
    firsts = [first.token_times[0] for first, _ in deployment.served]
    assert firsts == pytest.approx([r.token_times[0] for r in requests])
    assert all(len(r.output_ids) == r.max_new_tokens for r in deployment.requests)


def lone_request(extra: list[str]) -> tuple[Request, Request, Request]:
    """One request served disaggregated (1 + 1) and aggregated; and its prefill copy."""
    one = [*BASE, "workload.num_requests=1", "workload.min_prompt_tokens=1000",
           "workload.max_prompt_tokens=1000", "workload.min_new_tokens=30",
           "workload.max_new_tokens=30", "block_size=128", *extra]  # fmt: skip
    deployment = build_deployment(make_config([*one, "disagg.prefill=1", "disagg.decode=1"]))
    simulate(deployment)
    (served,), ((first, _),) = deployment.requests, deployment.served
    engine, (alone,) = build_engine(make_config(one))
    engine.warmup()
    engine.run([alone])
    return served, alone, first


def test_a_lone_requests_client_tokens_come_after_the_transfer_and_the_decode_step():
    served, alone, first = lone_request([])  # vLLM's path: the token recomputed
    pieces = 8 * 32 * 2  # 1000 tokens: 8 blocks of 128 in 32 layers, keys and values apart
    transfer = 1000 * 131072 / 50e9 + pieces * 2e-6 + 0.001  # the h100 profile's link
    assert first.token_times[0] == pytest.approx(alone.token_times[0] + 0.002)  # vllm's hop
    # The client's first token: the decode instance's first step after the transfer, a
    # one-token step over the prompt's context, cheaper than the prompt and not free.
    first_step = served.token_times[0] - first.token_times[0] - 0.002 - transfer  # hop again
    assert 0 < first_step < alone.token_times[0]
    # Then each decode step is the same batch of one at the same length on the same device.
    gaps = [b - a for a, b in zip(served.token_times, served.token_times[1:], strict=False)]
    alone_gaps = [b - a for a, b in zip(alone.token_times, alone.token_times[1:], strict=False)]
    assert gaps == pytest.approx(alone_gaps)


@pytest.mark.parametrize(
    ("engine", "second_hop"), [("vllm", 0.002), ("trtllm", 0.002), ("sglang", 0.0)]
)
def test_the_router_hops_again_before_the_pull_where_it_waits_for_the_prefills_reply(
    engine, second_hop
):
    """vLLM's proxy sends the decode request with the prefill reply's KV block ids, so its
    hop comes again before the pull; SGLang's router sends both at once."""
    cfg = make_config([*SMALL, "disagg.prefill=1", "disagg.decode=1", f"disagg.engine={engine}"])
    deployment = build_deployment(cfg)
    simulate(deployment)
    for first, rest in deployment.served:
        transfer = deployment.link.seconds(len(first.prompt_ids))
        assert rest.arrival_s == pytest.approx(first.token_times[0] + second_hop + transfer)


def test_a_lone_request_on_expert_parallel_pools_is_an_aggregated_ep_runs_shifted():
    """Each pool's instance is tp x dp cards with its experts over them: a lone request
    meets, on the first replica of each pool, what one replica of the aggregated layout
    gives it, its later tokens shifted by the transfer."""
    moe = ["model=spec/qwen3_30b_a3b", "tp=1", "dp=2", "ep=2"]
    cfg = make_config([*SMALL, *moe, "disagg.prefill=1", "disagg.decode=1"])
    assert (len(build_deployment(cfg).prefill), deployment_cards(cfg)) == (2, 4)
    served, alone, first = lone_request(moe)
    # Qwen3-30B-A3B's KV cache: 48 layers x 4 KV heads x 128 x (K and V) x 2 bytes a token
    transfer = 1000 * 48 * 4 * 128 * 2 * 2 / 50e9 + 8 * 48 * 2 * 2e-6 + 0.001
    assert first.token_times[0] == pytest.approx(alone.token_times[0] + 0.002)
    assert served.token_times[0] - first.token_times[0] > transfer
    gaps = [b - a for a, b in zip(served.token_times, served.token_times[1:], strict=False)]
    alone_gaps = [b - a for a, b in zip(alone.token_times, alone.token_times[1:], strict=False)]
    assert gaps == pytest.approx(alone_gaps)


def test_each_pools_engines_split_the_experts_over_that_pools_own_cards():
    moe = [*SMALL, "model=spec/qwen3_30b_a3b", "tp=1", "dp=2", "ep=2", "disagg.prefill=1",
           "disagg.decode=2", "disagg.decode_dp=4"]  # fmt: skip
    deployment = build_deployment(make_config(moe))
    # 1 prefill instance of 2 replicas, 2 decode instances of 4: 2 + 8 engines, 10 cards
    assert (len(deployment.prefill), len(deployment.decode), deployment.cards) == (2, 8, 10)
    for engines, ep_dp in ((deployment.prefill, (2, 2)), (deployment.decode, (4, 4))):
        for engine in engines:
            assert engine.simulation is not None
            metrics = engine.simulation.metrics(0)
            assert (metrics["ep"], metrics["dp"]) == ep_dp


def test_a_pools_layout_is_checked_naming_its_key():
    moe = [*SMALL, "model=spec/qwen3_30b_a3b", "tp=1", "dp=2", "ep=2", "disagg.prefill=1",
           "disagg.decode=1"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"decode pool \(disagg.decode_dp=3, tp=1\): ep=3"):
        build_deployment(make_config([*moe, "disagg.decode_dp=3"]))  # 128 experts
    with pytest.raises(ConfigError, match="ep=4 must equal tp x dp"):
        build_deployment(make_config([*moe, "ep=4"]))  # the run's own layout first


def test_a_run_has_an_aggregated_runs_metrics_and_the_deployments_cards(tmp_path):
    cfg = make_config([*SMALL, "disagg.prefill=2", "disagg.decode=3", "disagg.decode_tp=2",
                       "slo.ttft_ms=500", "slo.tpot_ms=50"])  # fmt: skip
    deployment, metrics = serve_deployment(cfg, Slo.of(cfg.slo), tmp_path)
    assert metrics["cards"] == deployment_cards(cfg) == 2 * 1 + 3 * 2
    assert metrics["num_requests"] == 24 and metrics["num_errors"] == 0
    assert metrics["output_tokens"] == sum(r.max_new_tokens for r in deployment.requests)
    for key in ("output_throughput", "slo_attainment", "request_goodput"):
        assert metrics[key] is not None
    assert metrics["ttft_ms"]["p50"] > 0 and metrics["tpot_ms"]["p50"] > 0
    assert metrics["disagg"]["kv_transfer_ms"]["mean"] > 1.0  # the 1 ms latency and more
    assert pool_cfg(cfg, "decode").tp == 2 and pool_cfg(cfg, "prefill").tp == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["disagg.prefill=2"], "disagg.prefill=2 disagg.decode=0: .* set disagg.decode >= 1"),
        (["disagg.decode=2"], "disagg.prefill=0 disagg.decode=2: .* set disagg.prefill >= 1"),
        (["disagg.prefill=-1"], "disagg.prefill=-1 must be >= 0"),
        (["disagg.link_gbps=-5"], "disagg.link_gbps=-5.0 must be >= 0"),
        (["disagg.prefill=1", "disagg.decode=1", "disagg.engine=nginx"],
         "disagg.engine='nginx': give one of fastdeploy, sglang, triton-distributed, trtllm"),
        (["disagg.prefill=1", "disagg.decode=1", "disagg.prefill_max_tokens=8"],
         r"disagg.prefill_max_tokens=8 < max_num_seqs=16: .* raise disagg.prefill_max_tokens"),
        (["disagg.prefill=1", "disagg.decode=1", "disagg.decode_max_num_seqs=4096"],
         r"disagg.decode_max_num_seqs=4096 > max_tokens=2048: .* lower disagg.decode_max"),
    ],
)  # fmt: skip
def test_a_bad_pool_setting_is_a_one_line_error_naming_its_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_config(make_config([*SMALL, *overrides]))


def test_a_capacity_search_refuses_an_empty_pool_before_searching(tmp_path):
    cfg = make_config([*SMALL, "disagg.prefill=1", "slo.ttft_ms=500"])
    with pytest.raises(ConfigError, match="needs instances in both pools"):
        capacity_search(cfg, tmp_path)


def test_a_pool_tp_that_does_not_split_the_heads_names_its_key():
    cfg = make_config([*SMALL, "disagg.prefill=1", "disagg.decode=1", "disagg.prefill_tp=3"])
    with pytest.raises(ConfigError, match="disagg.prefill_tp: tp=3 does not split"):
        build_deployment(cfg)


def test_the_real_executor_refuses_disaggregation():
    cfg = make_config(["disagg.prefill=1", "disagg.decode=1"])
    with pytest.raises(ConfigError, match="disagg.decode=1 is simulated only"):
        check_config(cfg)


def goodput_per_card(tmp_path, overrides: list[str]) -> float:
    cfg = make_config(overrides)
    tmp_path.mkdir()
    result = capacity_search(cfg, tmp_path)
    assert result["capacity_found"]
    return result["capacity_rps"] * result["slo_attainment"] / deployment_cards(cfg)


TIGHT = [*BASE, "workload.rate=2", "workload.min_new_tokens=100", "workload.max_new_tokens=200",
         "slo.ttft_ms=600", "slo.tpot_ms=15", "capacity.max_probes=12"]  # fmt: skip
# Many more requests than the deployment's rows: a capacity bounded by steady serving,
# not by one burst that every row takes at once.
LONG = ["workload.num_requests=100", "workload.min_prompt_tokens=3000",
        "workload.max_prompt_tokens=4000"]  # fmt: skip
SHORT = ["workload.num_requests=200", "max_num_seqs=8", "workload.min_prompt_tokens=50",
         "workload.max_prompt_tokens=150"]  # fmt: skip


def test_long_prompts_under_tight_slos_serve_more_goodput_per_card_disaggregated(tmp_path):
    aggregated = goodput_per_card(tmp_path / "a", [*TIGHT, *LONG])
    disaggregated = goodput_per_card(
        tmp_path / "d", [*TIGHT, *LONG, "disagg.prefill=1", "disagg.decode=1"]
    )
    assert disaggregated > aggregated


def test_short_prompts_serve_less_goodput_per_card_disaggregated(tmp_path):
    aggregated = goodput_per_card(tmp_path / "a", [*TIGHT, *SHORT])
    for i, pools in enumerate((["disagg.prefill=1", "disagg.decode=1"],
                               ["disagg.prefill=1", "disagg.decode=2"])):  # fmt: skip
        assert goodput_per_card(tmp_path / str(i), [*TIGHT, *SHORT, *pools]) < aggregated


@pytest.mark.parametrize("no_evict", [False, True])
def test_a_transferred_prompt_joins_as_a_decode_holding_its_blocks(no_evict):
    kv = KVCacheManager(num_blocks=4, block_size=16)
    scheduler = ChunkedScheduler(
        kv_cache=kv, stop=StopRule((), 1024), max_tokens=64, max_num_seqs=2,
        max_model_len=1024, align_chunks=True, long_prefill_threshold=0, budget="padded",
        max_padding=1.0, no_evict=no_evict, max_prefill_rows=0, step_order="decode_first",
    )  # fmt: skip

    def arrived(n: int, new: int) -> Request:
        r = Request(id=str(n), index=n, prompt="x", prompt_ids=[1] * n, max_new_tokens=new)
        r.output_ids, r.token_times = [7], [0.0]  # its first token, from the prefill side
        return r

    first = arrived(40, 4)  # 41 tokens to hold: 3 blocks of 16
    assert scheduler.admit_computed(first)
    assert first.status is Status.RUNNING and scheduler.table.computed[0] == 40
    assert len(kv.block_table(first)) == 3 and kv.num_free_blocks == 1
    plan = scheduler.schedule(0.0)
    assert plan.decode == [first] and not plan.prefill  # no prefill computed here
    # A second prompt of 2 blocks finds 1 free: it waits, nothing taken.
    second = arrived(20, 4)
    assert not scheduler.admit_computed(second) and kv.num_free_blocks == 1


def most_in_flight(requests: list[Request]) -> int:
    """The most requests between their send and their finish at once: a sweep over the
    [send, finish) intervals, a finish counted before a send at the same time."""
    events = sorted([(r.finish_s, -1) for r in requests] + [(r.arrival_s, 1) for r in requests])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


CLOSED = [*SMALL, "workload.num_requests=40", "workload.rate=1000", "disagg.prefill=1",
          "disagg.decode=2"]  # fmt: skip


def test_a_closed_loop_never_has_more_requests_in_flight_than_its_concurrency(tmp_path):
    cfg = make_config([*CLOSED, "workload.concurrency=5"])
    deployment, metrics = serve_deployment(cfg, Slo.of(cfg.slo), tmp_path)
    requests = deployment.requests
    assert metrics["num_errors"] == 0
    assert all(len(r.output_ids) == r.max_new_tokens for r in requests)
    assert most_in_flight(requests) == 5  # held to 5, and 40 requests at once fill all 5
    # Each held-back request is sent when a finished one freed its slot, never before.
    finishes = sorted(r.finish_s for r in requests)
    sent_late = sorted(r.arrival_s for r in requests)[5:]
    assert all(s >= f for s, f in zip(sent_late, finishes, strict=False))


def test_a_closed_loop_wider_than_the_workload_serves_as_the_open_loop():
    """Side by side in time order (the closed loop's way) and one pool after the other
    (the open loop's) are two implementations: with no request held back they agree."""
    open_loop = build_deployment(make_config(CLOSED))
    simulate(open_loop)
    closed = build_deployment(make_config([*CLOSED, "workload.concurrency=40"]))
    simulate(closed)
    for a, b in zip(open_loop.requests, closed.requests, strict=True):
        assert b.arrival_s == a.arrival_s
        assert b.token_times == pytest.approx(a.token_times)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "triton-distributed"])
def test_a_requests_ttft_parts_add_up_to_its_ttft(tmp_path, engine):
    cfg = make_config([*SMALL, "disagg.prefill=1", "disagg.decode=1", f"disagg.engine={engine}"])
    deployment, metrics = serve_deployment(cfg, Slo.of(cfg.slo), tmp_path)
    parts = ttft_parts_s(deployment.served, deployment.hops_s)
    for i, r in enumerate(deployment.requests):
        ttft = r.token_times[0] - r.arrival_s
        assert sum(parts[part][i] for part in parts) == pytest.approx(ttft)
        transfer = deployment.link.seconds(len(r.prompt_ids))
        if engine == "triton-distributed":  # pulled by the decode instance, in its part
            assert parts["transfer"][i] == 0 and parts["decode"][i] >= transfer
        else:
            assert parts["transfer"][i] == pytest.approx(transfer)
    assert set(metrics["disagg"]["ttft_parts_ms"]) == set(parts)


@pytest.mark.parametrize("engine", ["sglang", "triton-distributed"])
def test_a_carried_first_token_reaches_the_client_when_the_decode_instance_takes_it(engine):
    """SGLang carries the prefill instance's token over with the KV cache (pulled beside
    the decode instance's steps); Triton Distributed's patch does too, its decode instance
    pulling the KV cache itself: a lone request gets its first token after the prefill
    instance's and the transfer either way, and decodes the rest as aggregated."""
    served, alone, first = lone_request([f"disagg.engine={engine}"])
    # The packed path moves keys and values as one piece each; the paged one, 512 pieces.
    pieces = 2 if engine == "triton-distributed" else 8 * 32 * 2
    transfer = 1000 * 131072 / 50e9 + pieces * 2e-6 + 0.001
    assert served.output_ids[0] == first.output_ids[0]
    assert served.token_times[0] == pytest.approx(first.token_times[0] + transfer)
    gaps = [b - a for a, b in zip(served.token_times, served.token_times[1:], strict=False)]
    alone_gaps = [b - a for a, b in zip(alone.token_times, alone.token_times[1:], strict=False)]
    assert gaps == pytest.approx(alone_gaps)


def test_the_path_is_the_run_engines_unless_disagg_engine_names_another():
    pools = [*SMALL, "disagg.prefill=1", "disagg.decode=1"]
    assert build_deployment(make_config(pools)).path == DISAGG_ENGINES["vllm"]  # native's
    sglang = build_deployment(make_config([*pools, "engine=sglang"]))
    assert sglang.path == DISAGG_ENGINES["sglang"] and sglang.router_s == 0.0005
    named = make_config([*pools, "engine=sglang", "disagg.engine=triton-distributed"])
    assert build_deployment(named).path == DISAGG_ENGINES["triton-distributed"]


def test_a_pull_the_decode_instance_makes_itself_holds_up_its_running_requests():
    two = [*SMALL, "workload.num_requests=2", "workload.rate=0", "workload.min_prompt_tokens=4000",
           "workload.max_prompt_tokens=4000", "workload.min_new_tokens=40",
           "workload.max_new_tokens=40", "max_num_seqs=1", "disagg.prefill=1",
           "disagg.decode=1", "disagg.decode_max_num_seqs=2"]  # fmt: skip
    longest = {}
    for engine in ("sglang", "triton-distributed"):
        deployment = build_deployment(make_config([*two, f"disagg.engine={engine}"]))
        simulate(deployment)
        early = min(deployment.requests, key=lambda r: r.token_times[0])
        gaps = [b - a for a, b in zip(early.token_times, early.token_times[1:], strict=False)]
        longest[engine] = max(gaps)
    # The second prompt's pull (4000 tokens, packed: 2 pieces) stops the decode instance
    # while the first request is decoding there: one of its gaps holds it whole.
    pull = 4000 * 131072 / 50e9 + 2 * 2e-6 + 0.001
    assert longest["triton-distributed"] >= pull
    assert longest["sglang"] < pull  # pulled beside the steps


def test_the_published_checks_split_fitted_and_held_out_rows_and_price_pieces_by_hand():
    row = {"bytes": "1000000000", "pieces": "1000", "link_gbps": "10", "published_ms": "50",
           "role": "held_out"}  # fmt: skip
    assert transfer_ms(row, 2e-6) == pytest.approx(100 + 2)  # 1 GB at 10 GB/s, 1000 x 2 us
    fitted = {**row, "role": "fit", "published_ms": "100"}
    pd_row = {"kind": "disaggregated", "ttft_ms": "100", "itl_ms": "10", "role": "held_out",
              "profile": "vllm"}  # fmt: skip
    control = {**pd_row, "kind": "aggregated"}
    pd_fit = {**pd_row, "role": "fit"}
    pd_v0 = {**pd_row, "profile": "vllm_v0", "ttft_ms": "200"}
    latency = [LatencyCheck(pd_row, 90, 12, {}), LatencyCheck(control, 300, 30, {}),
               LatencyCheck(pd_fit, 150, 10.5, {}), LatencyCheck(pd_v0, 140, 10, {})]  # fmt: skip
    errors = checked_errors(latency, [0.1, -0.3], [(row, 102.0), (fitted, 102.0)])
    assert errors["ttft"]["held_out"] == {"median": pytest.approx(0.2), "worst": pytest.approx(0.3)}
    # each engine profile's held-out rows apart: V1's -10%, vLLM 0.6.3's -30%
    assert errors["ttft"]["held_out vllm"]["worst"] == pytest.approx(0.1)
    assert errors["ttft"]["held_out vllm_v0"]["worst"] == pytest.approx(0.3)
    assert errors["itl"]["held_out"]["worst"] == pytest.approx(0.2)  # the control left out
    assert errors["ttft"]["fit"]["worst"] == pytest.approx(0.5)
    assert errors["itl"]["all"] == {"median": pytest.approx(0.05), "worst": pytest.approx(0.2)}
    assert errors["ratio"]["held_out"] == {
        "median": pytest.approx(0.2),
        "worst": pytest.approx(0.3),
    }
    assert errors["transfer"]["fit"]["median"] == pytest.approx(0.02)
    assert errors["transfer"]["held_out"]["median"] == pytest.approx(102 / 50 - 1)
    # A published row's deployment composes as a closed loop on its engine's path.
    pd = {"kind": "disaggregated", "hardware": "h100", "model": "llama31_70b",
          "quantization": "fp8", "kv_cache_dtype": "fp8", "input_tokens": "3000",
          "output_tokens": "150", "requests": "480", "concurrency": "48", "prefill": "4",
          "prefill_tp": "2", "decode": "1", "decode_tp": "8",
          "engine": "triton-distributed", "router": "consistent_hash", "profile": "vllm_v0",
          "scheduler": "whole",
          "block_size": "16", "max_model_len": "3500", "max_batched_tokens": "3500",
          "max_num_seqs": "256"}  # fmt: skip
    cfg = make_config(latency_overrides(pd))
    check_config(cfg)
    assert (cfg.workload.concurrency, cfg.disagg.engine, cfg.disagg.router) == (
        48,
        "triton-distributed",
        "consistent_hash",
    )
    assert deployment_cards(cfg) == 16
