"""A disaggregated deployment on the simulated device: `disagg.prefill` prefill instances and
`disagg.decode` decode instances, each the real scheduler, KV-cache manager and metadata
builder over its own SimulatedDevice, with its own tp and limits (pipeline.disagg.config).
An instance with dp attention replicas (`disagg.<role>_dp`, else the run's dp) is dp such
engines, its experts split over its tp x dp cards when the run has ep > 1; the router
(`disagg.router`, pipeline.disagg.routing) picks among every replica of a pool.

A request goes as its engine's path sends it (stages.simulator.disagg_engines,
`disagg.engine`):

1. Prefill: after the router's hop, the router sends each request, in arrival order, to a
   prefill instance, which serves it to its first token only.
2. Transfer: (after the router's hop again where it waits for the prefill's reply) the
   prompt's KV cache takes stages.simulator.disaggregation's KvLink.seconds (bytes over
   the link, a time per piece, a transfer's fixed time): beside the decode instance's
   steps, the request arriving there once it is done, or, where the engine pulls it
   inside a step, at the decode instance, which stops for it when it takes it in.
3. Decode: the router sends each request, in the order they arrive there, to a decode
   instance. One is admitted on arrival when max_num_seqs and its pool have room (its
   prompt's blocks taken at once), else it waits, in order, for room
   (pipeline.disagg.admission). The client's first token is the decode instance's: its
   first step computes the last prompt token again and samples it (vLLM), or the prefill
   instance's token, carried over, is sent once the instance takes the request in; then
   it decodes to its end. A request preempted there is recomputed there.

Every output token, so TTFT (router + prefill + transfer + the decode instance's part),
ITL, TPOT and end-to-end latency, is the one a client reads; metrics.json gives each part
of TTFT (pipeline.disagg.latency). Open loop, decode never feeds back to prefill, so the
pools run one after the other; a closed loop (`workload.concurrency`) or a router that
follows the load runs them side by side (pipeline.disagg.closed_loop). The run's duration
is when its last instance ends.

Not modelled: the decode pool's back-pressure on prefill (a prefill instance frees a
request's blocks at its first token, not once the transfer ends, and never waits for a
decode instance's room); link contention (each transfer has the whole link of every
sending device; transfers overlapping on one link do not share it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pipeline.config.checks import ConfigError, check_model_context, describe_model
from pipeline.disagg.admission import DecodeAdmission
from pipeline.disagg.closed_loop import ClosedLoop, Copies, Feed
from pipeline.disagg.config import (
    DECODE,
    PREFILL,
    check_layouts,
    deployment_cards,
    disaggregated,
    path_engine,
    pool_cfg,
    pool_of,
)
from pipeline.disagg.latency import describe_parts, ttft_parts_ms
from pipeline.disagg.routing import Router, make_router, shares
from pipeline.executors import check_config
from pipeline.executors.build import build, load_workload
from pipeline.executors.fast_forward import FastForward
from pipeline.executors.simulated import simulated_engine
from pipeline.job.console import summary_table
from pipeline.job.engine import Engine, long_lived_frozen
from pipeline.job.metrics import StepTotals, stats, summarise
from pipeline.job.serving import Hooks, fail_if_none_served, report_failures, serve_and_summarise
from pipeline.job.slo import Slo, slo_metrics
from pipeline.run_folder import artefacts
from pipeline.run_folder.reader import RunStatus
from stages.scheduling.request import FinishReason, Request
from stages.simulator.device import VirtualClock
from stages.simulator.disagg_engines import DisaggPath, FirstToken, disagg_path
from stages.simulator.disaggregation import KvLink, LinkSettings, kv_link
from stages.simulator.precision import Precision


@dataclass
class Deployment:
    """The instances of both pools, the KV link between them, and the workload."""

    cfg: DictConfig
    prefill: list[Engine]
    decode: list[Engine]
    link: KvLink
    path: DisaggPath  # the engine's: its first token, its pull, its pieces
    router_s: float  # the router's hop before a request reaches a prefill instance
    routers: tuple[Router, Router]  # each pool's instance for a request (disagg.router)
    requests: list[Request]
    totals: StepTotals = field(default_factory=StepTotals)
    transfer_s: dict[int, float] = field(default_factory=dict)  # by the decode copy's seq_id
    pulls: dict[int, float] = field(default_factory=dict)  # those the decode instance makes
    # each request's prefill copy and decode copy (None: it ended on the prefill instance)
    served: list[tuple[Request, Request | None]] = field(default_factory=list)

    @property
    def cards(self) -> int:
        return deployment_cards(self.cfg)

    @property
    def hops_s(self) -> tuple[float, float]:
        """The router's hop before each pool's instance sees a request."""
        return self.router_s, self.router_s if self.path.reply_first else 0.0

    @property
    def engines(self) -> list[Engine]:
        return [*self.prefill, *self.decode]

    def warmup(self) -> float:
        """Each instance compiles its own shapes, side by side: the longest's seconds."""
        return max(engine.warmup() for engine in self.engines)

    def now(self) -> float:
        return max(engine.now() for engine in self.engines)


def build_deployment(cfg: DictConfig) -> Deployment:
    """Every instance of both pools, each on its own virtual clock; the workload once."""
    tokenizer = build(cfg.tokenizer)
    spec, _ = describe_model(cfg)
    check_model_context(cfg, spec)
    check_layouts(cfg, spec)
    if cfg.hardware is None:
        raise ConfigError("executor=simulated needs a device: give hardware=gaudi3 (or ...)")
    hardware = build(cfg.hardware)
    workload, requests = load_workload(cfg, tokenizer)
    pools = {}
    for role in (PREFILL, DECODE):
        instance, pool = pool_cfg(cfg, role), pool_of(cfg, role)
        # Each dp replica of an instance is an engine of its own, as the simulated device
        # runs one dp replica (its MoE layers costed with the other replicas' tokens).
        pools[role] = [
            simulated_engine(instance, VirtualClock(), spec, hardware, tokenizer, workload)
            for _ in range(pool.instances * pool.dp)
        ]
    disagg = cfg.disagg
    try:
        precision = Precision(cfg.quantization, cfg.kv_cache_dtype)
        tps = (pool_of(cfg, PREFILL).tp, pool_of(cfg, DECODE).tp)
        settings = LinkSettings(disagg.link_gbps, disagg.transfer_latency_s,
                                disagg.transfer_piece_s)  # fmt: skip
        path = disagg_path(path_engine(cfg))
        link = kv_link(spec, hardware, precision, tps, int(cfg.block_size), settings, path.paged)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    router_s = disagg.router_s if disagg.router_s >= 0 else path.router_s
    routers = (make_router(disagg.router, len(pools[PREFILL]), PREFILL),
               make_router(disagg.router, len(pools[DECODE]), DECODE))  # fmt: skip
    return Deployment(cfg, pools[PREFILL], pools[DECODE], link, path, router_s, routers, requests)


def copy_request(r: Request, max_new_tokens: int, arrival_s: float) -> Request:
    """A fresh request of the same prompt for one pool's instance (its own sequence id)."""
    return Request(
        id=r.id, index=r.index, prompt=r.prompt, prompt_ids=r.prompt_ids,
        max_new_tokens=max_new_tokens, arrival_s=arrival_s, ignore_eos=r.ignore_eos,
        stop=list(r.stop), sampling=r.sampling,
    )  # fmt: skip


def run_instance(engine: Engine, requests: list[Request], totals: StepTotals) -> float:
    """One prefill instance serves its requests (runs of decode steps done at once)."""
    return engine.run(requests, on_step=totals.add, on_run=totals.add_run)


def prefill_copy(deployment: Deployment, r: Request) -> Request:
    """The request as its prefill instance gets it: after the hop, for its first token."""
    return copy_request(r, 1, r.arrival_s + deployment.hops_s[0])


def decode_copy(deployment: Deployment, r: Request, first: Request) -> Request | None:
    """The request as its decode instance gets it after the prefill instance's token: once
    its KV cache arrived, or at once where the decode instance pulls it itself; with the
    prefill's token where the engine carries it over. None where the prefill instance
    failed it, or its carried token is its whole output."""
    path = deployment.path
    carried = path.first_token is FirstToken.CARRIED
    if first.finish_reason == FinishReason.ERROR or (carried and r.max_new_tokens <= 1):
        return None
    seconds = deployment.link.seconds(r.num_prompt_tokens)
    sent = first.token_times[0] + deployment.hops_s[1]
    arrival = sent + (0.0 if path.pull_blocks else seconds)
    copy = copy_request(r, r.max_new_tokens, arrival)
    deployment.transfer_s[copy.seq_id] = seconds
    if path.pull_blocks:
        deployment.pulls[copy.seq_id] = seconds
    if carried:
        copy.output_ids = first.output_ids[:1]  # its time: when the decode instance takes it
    return copy


def prefill_pass(deployment: Deployment) -> tuple[list[Request], float]:
    """Each request to its first token on a prefill instance; the prefill copies, in the
    requests' order, and when the last instance finished."""
    ordered = sorted(deployment.requests, key=lambda r: r.arrival_s)
    copies = {r.seq_id: prefill_copy(deployment, r) for r in ordered}
    ordered_copies = [copies[r.seq_id] for r in ordered]
    end = 0.0
    picked = shares(deployment.routers[0], ordered_copies, len(deployment.prefill))
    for engine, share in zip(deployment.prefill, picked, strict=True):
        end = max(end, run_instance(engine, share, deployment.totals))
    return [copies[r.seq_id] for r in deployment.requests], end


def run_decode_instance(
    engine: Engine, requests: list[Request], totals: StepTotals, pulls: dict[int, float]
) -> float:
    """One decode instance serves the requests whose KV cache it receives (`pulls`: the
    seconds of those it pulls itself)."""
    clock = engine.clock
    clock.restart()
    engine.reject_invalid(requests)
    admit = DecodeAdmission(engine.scheduler, clock, pulls)
    source = Feed(engine, admit, [r for r in requests if not r.finished])
    fast_forward = None
    if engine.simulation is not None:
        fast_forward = FastForward(
            engine, source.next_arrival, source.finishes_before_change, totals.add_run
        )
    with long_lived_frozen():
        return engine.loop(source, on_step=totals.add, advance=fast_forward)


def decode_pass(
    deployment: Deployment, firsts: list[Request]
) -> tuple[list[Request | None], float]:
    """Each request decoded to its end on a decode instance after its transfer; the decode
    copies (None where the prefill instance failed it), and when the last instance
    finished."""
    copies = [
        decode_copy(deployment, r, first)
        for r, first in zip(deployment.requests, firsts, strict=True)
    ]
    arrived = sorted((c for c in copies if c is not None), key=lambda c: c.arrival_s)
    end = 0.0
    picked = shares(deployment.routers[1], arrived, len(deployment.decode))
    for engine, share in zip(deployment.decode, picked, strict=True):
        end = max(end, run_decode_instance(engine, share, deployment.totals, deployment.pulls))
    return copies, end


def merge(r: Request, first: Request, rest: Request | None) -> None:
    """The request as the deployment served it: its tokens and its end the decode pool's
    (the prefill pool's where it failed there)."""
    served = rest or first
    r.output_ids = served.output_ids
    r.token_times = served.token_times
    r.status, r.finish_reason, r.error = served.status, served.finish_reason, served.error
    r.finish_s = served.finish_s
    r.num_preemptions = first.num_preemptions + (rest.num_preemptions if rest else 0)
    r.cached_tokens = first.cached_tokens


def simulate(deployment: Deployment) -> float:
    """Serves the deployment's requests through both pools; returns the run's duration
    (its last instance's end). Each request ends as the deployment served it."""
    concurrency = int(deployment.cfg.workload.get("concurrency") or 0)
    if concurrency or deployment.routers[0].follows_load:  # 0: open loop, side by side
        copies = Copies(
            lambda r: prefill_copy(deployment, r),
            lambda r, first: decode_copy(deployment, r, first),
        )
        pools = (deployment.prefill, deployment.decode)
        loop = ClosedLoop(pools, deployment.requests, concurrency, copies, deployment.totals,
                          deployment.pulls, deployment.routers)  # fmt: skip
        firsts, rests, end = loop.serve()
        finish(deployment, firsts, rests)
        return end
    firsts, prefill_end = prefill_pass(deployment)
    rests, decode_end = decode_pass(deployment, firsts)
    finish(deployment, firsts, rests)
    return max(prefill_end, decode_end)


def finish(deployment: Deployment, firsts: list[Request], rests: list[Request | None]) -> None:
    """Each request ends as the deployment served it; the copies are kept for its metrics."""
    for r, first, rest in zip(deployment.requests, firsts, rests, strict=True):
        merge(r, first, rest)
    deployment.served = list(zip(firsts, rests, strict=True))


def deployment_metrics(
    deployment: Deployment, duration: float, warmup_s: float, status: RunStatus, slo: Slo
) -> dict[str, Any]:
    """metrics.json of a disaggregated run: the serving metrics and the SLO's as an
    aggregated run's, the pools' (cards, KV pools, warmup) and the KV transfers'."""
    cfg, requests = deployment.cfg, deployment.requests
    prefill, decode = deployment.prefill[0], deployment.decode[0]
    shapes: dict[str, int] = {}  # each pool's instances, and each instance's tp, dp and ep
    for role in (PREFILL, DECODE):
        pool = pool_of(cfg, role)
        shapes |= {role: pool.instances, f"{role}_tp": pool.tp, f"{role}_dp": pool.dp,
                   f"{role}_ep": pool.ep}  # fmt: skip
    device = _device_metrics(decode)
    parts = ttft_parts_ms(deployment.served, deployment.hops_s)
    warmups = [_device_metrics(e).get("predicted_warmup_s") or 0.0 for e in (prefill, decode)]
    return {
        "status": status,
        **summarise(requests, deployment.totals, duration),
        **slo_metrics(requests, duration, slo),
        "bucket_misses": sum(e.metadata.bucket_misses for e in deployment.engines),
        "warmup_s": warmup_s,
        "num_blocks": decode.scheduler.kv_cache.num_blocks,
        "max_model_len": cfg.max_model_len,
        **device,
        "predicted_warmup_s": max(warmups),  # the pools warm up side by side
        "cards": deployment.cards,
        "disagg": {
            **shapes,
            "prefill_num_blocks": prefill.scheduler.kv_cache.num_blocks,
            "decode_num_blocks": decode.scheduler.kv_cache.num_blocks,
            "link_gbps": deployment.link.bytes_per_s / 1e9,
            "transfer_latency_s": deployment.link.latency_s,
            "transfer_piece_s": deployment.link.piece_s,
            "block_size": deployment.link.layout.block_size,
            "engine": path_engine(cfg),
            "router_s": deployment.router_s,
            "router": cfg.disagg.router,
            "kv_transfer_ms": stats([s * 1e3 for s in deployment.transfer_s.values()]),
            "ttft_parts_ms": parts,
        },
    }


def _device_metrics(engine: Engine) -> dict[str, Any]:
    simulation = engine.simulation
    if simulation is None:
        return {"simulated": False}
    return simulation.metrics(sum(engine.warmup_counts().values()))


def serve_deployment(
    cfg: DictConfig, slo: Slo, out_dir: Path, generations: bool = True
) -> tuple[Deployment, dict[str, Any]]:
    """Checks the config, builds the deployment and serves its workload through the shared
    sequence into `out_dir`: metrics.json, and generations.jsonl as an aggregated run's
    when asked (no steps.jsonl: the pools' steps interleave)."""
    check_config(cfg)
    deployment = build_deployment(cfg)
    hooks = Hooks()
    if generations:
        writer = artefacts.GenerationWriter(out_dir, deployment.prefill[0].tokenizer)

        def write_generations() -> None:
            for r in deployment.requests:
                writer(r)
            writer.finish()

        hooks = Hooks(finish=write_generations)

    def summarise_run(duration: float, warmup_s: float, status: RunStatus) -> dict[str, Any]:
        metrics = deployment_metrics(deployment, duration, warmup_s, status, slo)
        return fail_if_none_served(metrics, deployment.requests, status)

    served = serve_and_summarise(
        cfg, deployment, lambda: simulate(deployment), lambda: (), summarise_run, out_dir,
        hooks=hooks,
    )  # fmt: skip
    return deployment, served.metrics


def run_deployment(cfg: DictConfig, out_dir: Path, slo: Slo) -> dict[str, Any]:
    """A disaggregated run into `out_dir`; prints the summary."""
    deployment, metrics = serve_deployment(cfg, slo, out_dir)
    print(f"{metrics['status']}: {out_dir}\n{summary_table(metrics)}\n{describe(metrics)}")
    report_failures(metrics, deployment.requests)
    return metrics


def describe(metrics: dict[str, Any]) -> str:
    """The deployment's lines under the summary: its pools, cards and KV transfers."""
    d = metrics["disagg"]
    transfer = d["kv_transfer_ms"]
    mean, p99 = ("-" if transfer[k] is None else f"{transfer[k]:.2f} ms" for k in ("mean", "p99"))

    def pool(role: str) -> str:
        dp = d.get(f"{role}_dp", 1)  # a folder written before pools had dp
        return f"{d[role]} {role} x tp{d[f'{role}_tp']}" + (f" x dp{dp}" if dp > 1 else "")

    piece = d.get("transfer_piece_s", 0.0)  # a folder written before pieces were counted
    lines = [
        f"  deployment  {pool(PREFILL)} + {pool(DECODE)} = {metrics['cards']} cards, "
        f"router {d.get('router', 'round_robin')}",  # a folder written before policies
        f"  KV transfer  mean {mean}, p99 {p99} ({d['link_gbps']:g} GB/s per device, "
        f"{d['transfer_latency_s'] * 1e3:g} ms a transfer, {piece * 1e6:g} us a piece)",
    ]
    if "ttft_parts_ms" in d:
        lines.append(describe_parts(d["ttft_parts_ms"]))
    return "\n".join(lines)


def search_stand_in(cfg: DictConfig) -> tuple[DictConfig, int]:
    """What a capacity search builds to start from: the config itself (1), or for a
    deployment one decode instance, whose load the D instances share (D)."""
    if not disaggregated(cfg):
        return cfg, 1
    return pool_cfg(cfg, DECODE), int(cfg.disagg.decode)
