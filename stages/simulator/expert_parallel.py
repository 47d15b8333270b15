"""Expert parallelism (`ep`) and data-parallel attention (`dp`) on a simulated device.

The layout is vLLM's with `--enable-expert-parallel`: `dp` attention replicas, each
tensor-parallel over `tp` devices, and the MoE layers' routed experts split whole over
ep = tp x dp ranks ("The EP size is automatically calculated" as TP x DP:
docs.vllm.ai/en/latest/serving/expert_parallel_deployment/; FastDeploy's DP=8, TP=1, EP=8
for ERNIE-4.5-300B: paddlepaddle.github.io/FastDeploy/features/data_parallel_service).

The simulated device is ONE dp replica: its scheduler, its batch, its KV pool. Its
attention, dense layers and shared experts run as today under tp on its own tokens; the
MoE layers see the tokens of every replica (dp x this replica's, the replicas assumed
balanced) split over the ep ranks:

- routed pairs a rank computes, per MoE layer: dp x tokens x k / ep x `imbalance`
  (the busiest rank's load over the mean: every rank waits for it);
- expert weights a rank reads: of the E / ep experts it holds, those the dp x tokens
  touch (uniform routing, as stages.model.spec.MoeLayout.experts_touched);
- dispatch and combine, per MoE layer, over the links to the rank's peers, each collective
  paying the profile's per-call link latency (`allreduce_latency_s`: the same links, the
  same call cost). What a token's hidden state costs depends on the engine's kernels
  (`ep_dispatch`; vLLM's `--all2all-backend`,
  docs.vllm.ai/en/latest/serving/expert_parallel_deployment/):
  `allgather` (vLLM's default allgather_reducescatter: every rank gathers the other dp
  replicas' tokens whole and reduce-scatters the outputs back, dp - 1 copies of each),
  `per_rank` (DeepEP's high-throughput kernels: a token goes once to each other rank
  holding one of its k experts, expected under uniform routing) and `per_expert` (DeepEP's
  low-latency kernels: once per routed expert, k (ep - 1) / ep copies from each tp rank's
  1 / tp of the tokens).

The dp replicas run their MoE layers in lockstep: every collective waits for the last
replica to reach it, so a step of the deployment lasts as long as its slowest replica's
(TensorRT-LLM's ADP balance blog: "the iteration time is dominated by the slowest rank",
docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md). The replicas' step times
differ (their rows, their contexts, each rank's own scheduling and sampling): read as
normal with relative spread `step_spread` about the simulated replica's, the slowest of
dp is 1 + step_spread x the expected largest of dp standard normal draws times it
(`lockstep`; 1 at dp = 1).

With ep = 1 and dp = 1 nothing here is asked: the cost model is the one before.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from stages.model.spec import ModelSpec
from stages.simulator.moe_layer import (
    busiest_rank_experts,
    busiest_rank_pairs,
    check_skew,
    largest_of_normals,
)
from stages.simulator.step_work import GEMMS_PER_LAYER, MLP_GEMMS

# The busiest EP rank's routed tokens over the mean. 1.0: balanced, what expert placement
# by load (DeepSeek's EPLB, vLLM's --enable-eplb) aims for. No published max/mean figure
# for these models was verified; DeepEP's PR #393 (github.com/deepseek-ai/DeepEP/pull/393)
# shows per-rank counts varying substantially without it: set `ep_imbalance` from a
# measurement.
DEFAULT_IMBALANCE = 1.0
COLLECTIVES_PER_MOE_LAYER = 2  # dispatch, combine
# The relative spread of the dp replicas' step times (`dp_step_spread`), FITTED by
# `python -m benchmarks.published_moe --fit` to the attention-DP rows marked `fit` in
# pipeline/calibrate/data/published-moe.csv (TensorRT-LLM v1.0, Qwen3-235B-A22B on 8 H200,
# no ADP balancing); the rows marked `held_out` (8 H100; and the later overview's DEP4 and
# DEP8 rows, pipeline/calibrate/data/published-attention-dp.csv) check it.
DEFAULT_STEP_SPREAD = 0.4136


class Dispatch(enum.StrEnum):
    """How a token's hidden state reaches the ranks of its experts (`ep_dispatch`)."""

    allgather = "allgather"  # vLLM's default: all-gather and reduce-scatter over dp
    per_rank = "per_rank"  # DeepEP high-throughput: once per rank holding its experts
    per_expert = "per_expert"  # DeepEP low-latency: once per routed expert


@dataclass(frozen=True)
class ExpertParallel:
    """How the MoE layers are spread beyond tensor parallelism."""

    ep: int = 1
    dp: int = 1
    imbalance: float = DEFAULT_IMBALANCE
    dispatch: Dispatch = Dispatch.allgather
    skew: float = 1.0  # moe_routing_skew: routing as uniform over E / skew experts
    step_spread: float = DEFAULT_STEP_SPREAD  # dp_step_spread: replicas' step times' spread

    @property
    def plain(self) -> bool:
        """No expert parallelism: the MoE layers run under tp like every other layer."""
        return self.ep == 1

    @property
    def lockstep(self) -> float:
        """A deployment's step over its simulated replica's: the expected slowest of dp
        replicas in lockstep (1 at dp = 1)."""
        return 1.0 + self.step_spread * largest_of_normals(self.dp)


PLAIN = ExpertParallel()


def check_layout(spec: ModelSpec, tp: int, layout: ExpertParallel) -> None:
    """The engines' constraint, one line naming the keys: ep is 1 or tp x dp, experts
    split evenly, expert parallelism only where there are experts."""
    ep, dp = layout.ep, layout.dp
    if ep < 1 or dp < 1:
        raise ValueError(f"ep={ep} and dp={dp} must each be >= 1")
    if not layout.imbalance >= 1.0:
        raise ValueError(f"ep_imbalance={layout.imbalance} must be >= 1 (busiest rank / mean)")
    if not layout.step_spread >= 0.0:
        raise ValueError(f"dp_step_spread={layout.step_spread} must be >= 0 (0: replicas alike)")
    moe = spec.moe
    check_skew(layout.skew, moe)
    if moe is None:
        if ep > 1:
            raise ValueError(f"ep={ep}: {spec.name} is dense (no experts to split): set ep=1")
        return
    if ep == 1 and dp > 1:
        raise ValueError(
            f"dp={dp} with ep=1 on {spec.name}: experts tensor-parallel over dp x tp ranks "
            f"is not modelled; set ep=tp x dp={tp * dp} (vLLM's --enable-expert-parallel)"
        )
    if ep > 1 and ep != tp * dp:
        raise ValueError(
            f"ep={ep} must equal tp x dp = {tp} x {dp} = {tp * dp} (vLLM and FastDeploy "
            "split the experts over every device of the deployment)"
        )
    if moe.num_experts % ep:
        raise ValueError(f"ep={ep} does not divide {spec.name}'s {moe.num_experts} experts")


def routed_pairs(spec: ModelSpec, tokens: Any, layout: ExpertParallel) -> Any:
    """Token-expert pairs the busiest rank computes in one MoE layer: every replica's
    tokens' pairs, those falling on the busiest of the ep ranks (all of them at ep = 1),
    times `imbalance` (skew beyond uniform routing's spread)."""
    assert spec.moe is not None
    return busiest_rank_pairs(spec.moe, layout.dp * tokens, layout.ep) * layout.imbalance


def experts_read(spec: ModelSpec, tokens: Any, layout: ExpertParallel) -> Any:
    """Experts the busiest rank reads in one MoE layer: of the E / ep it holds, those every
    replica's tokens touch (all touched ones at ep = 1, each split over tp)."""
    assert spec.moe is not None
    return busiest_rank_experts(spec.moe, layout.dp * tokens, layout.ep, layout.skew)


def copies_sent(spec: ModelSpec, tp: int, layout: ExpertParallel) -> float:
    """Hidden states a rank sends in one dispatch, per token of its replica."""
    assert spec.moe is not None
    k, ep, experts = spec.moe.experts_per_token, layout.ep, spec.moe.num_experts
    if layout.dispatch is Dispatch.allgather:
        return layout.dp - 1.0  # each tp rank holds its replica's tokens whole
    if layout.dispatch is Dispatch.per_rank:
        # A rank holds experts / ep of them: it gets none of a token's k with probability
        # C(experts - experts / ep, k) / C(experts, k).
        missed = math.comb(experts - experts // ep, k) / math.comb(experts, k)
        return (ep - 1) * (1.0 - missed) / tp
    return k * (ep - 1) / ep / tp


def alltoall_bytes(spec: ModelSpec, tokens: Any, tp: int, layout: ExpertParallel) -> Any:
    """What one rank sends in a step's dispatches and combines: per MoE layer, twice, the
    hidden states of its copies of the replica's tokens (`copies_sent`)."""
    one = tokens * spec.hidden_size * spec.dtype_bytes * copies_sent(spec, tp, layout)
    return COLLECTIVES_PER_MOE_LAYER * spec.num_moe_layers * one


def token_amounts(
    spec: ModelSpec, tp: int, tokens: Any, layout: ExpertParallel, weight_scale: float
) -> dict[str, Any]:
    """The GEMM and all-to-all amounts of a step's `tokens` on one rank: the layers outside
    the routed experts under tp, the routed experts by the pairs and weights the busiest
    rank gets (whole experts under expert parallelism, split over tp without), and the
    grouped GEMMs' kernels (stages.simulator.moe_layer)."""
    expert = spec.expert_params(1 if layout.ep > 1 else tp)
    moe_layers = spec.num_moe_layers
    flops = 2.0 * tokens * spec.non_routed_params(tp)
    flops = flops + 2.0 * routed_pairs(spec, tokens, layout) * expert * moe_layers
    touched = experts_read(spec, tokens, layout) * moe_layers if tokens > 0 else 0.0
    params = spec.non_routed_params(tp) + touched * expert if tokens > 0 else 0.0
    # An expert split over tp runs 1 / tp of its tiles on a device: its fixed time too.
    share = expert / spec.expert_params(1)
    sent = copies_sent(spec, tp, layout) if layout.ep > 1 else 0.0
    # A MoE layer's MLP GEMMs are its grouped ones (moe_fixed), but for shared experts.
    own_mlp = 0 if spec.shared_expert_params(tp) else MLP_GEMMS * moe_layers
    return {
        "gemms": (GEMMS_PER_LAYER * spec.num_layers - own_mlp) if tokens > 0 else 0,
        "linear_flops": flops,
        "linear_bytes": params * spec.dtype_bytes * weight_scale,
        "alltoall_bytes": alltoall_bytes(spec, tokens, tp, layout) if sent else 0.0,
        "alltoall_calls": COLLECTIVES_PER_MOE_LAYER * moe_layers if tokens > 0 and sent else 0,
        "moe_layers": moe_layers if tokens > 0 else 0,
        "moe_experts": touched * share,
    }


def routed_params_moved(spec: ModelSpec, tp: int, layout: ExpertParallel) -> float:
    """Weights per device that expert parallelism changes: the routed experts at tp are
    replaced by E / ep whole experts (negative: fewer)."""
    if layout.plain or spec.moe is None:
        return 0.0
    per_layer = spec.moe.num_experts
    at_tp = per_layer * spec.expert_params(tp)
    held = per_layer / layout.ep * spec.expert_params(1)
    return spec.num_moe_layers * (held - at_tp)
