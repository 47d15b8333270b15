"""A configuration's layout beyond tensor parallelism, read from its resolved config: expert
parallelism and data-parallel attention (`ep`, `dp`), prefill/decode disaggregation
(`disagg.*`) and speculative decoding (`speculative.*`). The one place that says how many
cards one replica of a configuration takes, used by the planner (pipeline/plan/) and the
deploy files (pipeline/deploy/):

- aggregated: tp x dp cards (dp attention replicas, each tensor-parallel over tp; the
  experts split over ep = tp x dp of them, stages/simulator/expert_parallel.py);
- disaggregated (`disagg.prefill` > 0): prefill x prefill_tp x prefill_dp + decode x
  decode_tp x decode_dp cards (a pool's tp or dp 0 = the run's). With expert parallelism
  (the run's ep > 1) each instance of a pool splits its experts over its own tp x dp
  cards, as an aggregated instance does.

The simulated device runs ONE dp replica (docs/simulator.md), so a replica of an aggregated
configuration serves dp times what the capacity search found; a disaggregated one is
simulated whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pool:
    """One pool of a disaggregated deployment: its instances and each one's limits."""

    role: str  # prefill or decode
    instances: int
    tp: int
    max_tokens: int
    max_num_seqs: int
    dp: int = 1  # attention replicas an instance
    ep: int = 1  # ranks an instance splits its experts over: 1, or tp x dp

    @property
    def cards(self) -> int:
        """Cards of the pool's instances in one replica of the deployment."""
        return self.instances * self.tp * self.dp


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1
    dp: int = 1
    ep_dispatch: str = "allgather"  # allgather, per_rank, per_expert
    prefill: int = 0  # prefill instances (0: aggregated)
    decode: int = 0
    prefill_tp: int = 0  # 0 = tp
    decode_tp: int = 0
    prefill_dp: int = 0  # 0 = dp
    decode_dp: int = 0
    prefill_max_tokens: int = 0  # 0 = the run's max_tokens
    decode_max_num_seqs: int = 0  # 0 = the run's max_num_seqs
    router: str = "round_robin"  # how the router picks instances (pipeline/disagg/routing.py)
    speculative: str = "none"  # none, mtp, eagle, draft, ngram
    speculative_tokens: int = 1
    # speculative=eagle, SGLang's tree (0: vLLM's chain of speculative_tokens)
    speculative_steps: int = 0
    speculative_topk: int = 0
    speculative_draft_tokens: int = 0
    draft_model: str = ""  # speculative=draft: the draft's model spec

    @property
    def draft_shape(self) -> str:
        """k for a chain, steps/topk/draft_tokens for a tree (as SGLang's flags give it)."""
        if not self.speculative_steps:
            return str(self.speculative_tokens)
        steps, topk = self.speculative_steps, self.speculative_topk or 1
        return f"{steps}/{topk}/{self.speculative_draft_tokens or steps + 1}"

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    @property
    def cards(self) -> int:
        """Cards one replica of the configuration takes."""
        if self.disaggregated:
            return sum(pool.cards for pool in self.pools(0, 0))
        return self.tp * self.dp

    @property
    def capacity_scale(self) -> int:
        """A replica's capacity over the simulated device's: dp replicas when aggregated."""
        return 1 if self.disaggregated else self.dp

    def pools(self, max_tokens: int, max_num_seqs: int) -> tuple[Pool, Pool]:
        """The prefill and decode pools, each limit defaulting to the run's; with expert
        parallelism an instance's experts go over its own tp x dp cards."""

        def pool(role: str, instances: int, tp: int, dp: int, tokens: int, seqs: int) -> Pool:
            tp, dp = tp or self.tp, dp or self.dp
            return Pool(role, instances, tp, tokens, seqs, dp, tp * dp if self.ep > 1 else 1)

        return (
            pool("prefill", self.prefill, self.prefill_tp, self.prefill_dp,
                 self.prefill_max_tokens or max_tokens, max_num_seqs),
            pool("decode", self.decode, self.decode_tp, self.decode_dp, max_tokens,
                 self.decode_max_num_seqs or max_num_seqs),
        )  # fmt: skip

    def columns(self) -> dict[str, str]:
        """The plan table's cells for this layout: ep/dp, P:D and speculative ("-" unset)."""
        return {
            "ep_dp": f"{self.ep}/{self.dp}" if (self.ep, self.dp) != (1, 1) else "-",
            "p_d": f"{self.prefill}:{self.decode}" if self.disaggregated else "-",
            "speculative": (
                f"{self.speculative}/{self.draft_shape}" if self.speculative != "none" else "-"
            ),
        }


def _int(node: Mapping[str, Any], key: str, default: int) -> int:
    value = node.get(key)
    return default if value is None else int(value)


def layout_of(config: Mapping[str, Any]) -> Layout:
    """The layout a resolved config (a mapping, or a DictConfig) describes; a key it lacks
    (a config from before the key existed) takes its default."""
    disagg = config.get("disagg") or {}
    spec = config.get("speculative") or {}
    return Layout(
        tp=_int(config, "tp", 1) or 1,
        ep=_int(config, "ep", 1),
        dp=_int(config, "dp", 1),
        ep_dispatch=str(config.get("ep_dispatch") or "allgather"),
        prefill=_int(disagg, "prefill", 0),
        decode=_int(disagg, "decode", 0),
        prefill_tp=_int(disagg, "prefill_tp", 0),
        decode_tp=_int(disagg, "decode_tp", 0),
        prefill_dp=_int(disagg, "prefill_dp", 0),
        decode_dp=_int(disagg, "decode_dp", 0),
        prefill_max_tokens=_int(disagg, "prefill_max_tokens", 0),
        decode_max_num_seqs=_int(disagg, "decode_max_num_seqs", 0),
        router=str(disagg.get("router") or "round_robin"),
        speculative=str(spec.get("method") or "none"),
        speculative_tokens=_int(spec, "tokens", 1),
        speculative_steps=_int(spec, "steps", 0),
        speculative_topk=_int(spec, "topk", 0),
        speculative_draft_tokens=_int(spec, "draft_tokens", 0),
        draft_model=str(spec.get("draft_model") or ""),
    )
