"""The `disagg.*` keys: whether a config asks for a disaggregated deployment, its checks (each
a one-line error naming the key) and each pool's config; its pools and cards are
pipeline/config/layout.py's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.config.layout import Pool, layout_of
from pipeline.disagg.routing import policy_error
from pipeline.schema import DisaggConf
from stages.model.spec import ModelSpec
from stages.simulator.disagg_engines import disagg_path
from stages.simulator.expert_parallel import ExpertParallel, check_layout

PREFILL, DECODE = "prefill", "decode"


# Each instance is an engine simulated side by side; published disaggregated deployments
# run a few to a few dozen a pool (DistServe, Mooncake, DeepSeek-V3's 4 prefill and 18
# decode nodes); 1,000 and 1,000 grew by 700 MB in 40 s without end.
MAX_POOL_INSTANCES = 64


def disaggregated(cfg: DictConfig | Mapping[str, Any]) -> bool:
    """Prefill and decode instances apart (`disagg.prefill`, `disagg.decode`); 0 and 0
    is one aggregated instance."""
    disagg = cfg.get("disagg") or {}
    return bool(disagg.get(PREFILL) or disagg.get(DECODE))


def deployment_cards(cfg: DictConfig | Mapping[str, Any]) -> int:
    """Cards of one copy of the configuration (pipeline/config/layout.py's count)."""
    return layout_of(cfg).cards


def pool_of(cfg: DictConfig | Mapping[str, Any], role: str) -> Pool:
    """A pool's instances, their tp, dp, ep and limits (pipeline/config/layout.py)."""
    prefill, decode = layout_of(cfg).pools(int(cfg["max_tokens"]), int(cfg["max_num_seqs"]))
    return prefill if role == PREFILL else decode


def pool_cfg(cfg: DictConfig, role: str) -> DictConfig:
    """The config one dp replica of a pool's instance runs: its tp, dp, ep and limits
    (pipeline/config/layout.py's pools: 0 = the run's value), no disaggregation of its own."""
    pool, instance = pool_of(cfg, role), cfg.copy()
    OmegaConf.update(instance, "tp", pool.tp)
    OmegaConf.update(instance, "dp", pool.dp)
    OmegaConf.update(instance, "ep", pool.ep)
    OmegaConf.update(instance, "max_tokens", pool.max_tokens)
    OmegaConf.update(instance, "max_num_seqs", pool.max_num_seqs)
    instance.disagg = DisaggConf()
    return instance


def path_engine(cfg: DictConfig | Mapping[str, Any]) -> str:
    """Whose disaggregated path a deployment takes (stages.simulator.disagg_engines):
    `disagg.engine`, else the run's engine profile (`engine=`), whose name is the table's
    key; this tool's own (`native`) takes vLLM's."""
    disagg = cfg.get("disagg") or {}
    if disagg.get("engine"):
        return str(disagg["engine"])
    name = str((cfg.get("engine") or {}).get("name") or "native")
    return "vllm" if name == "native" else name


def check_disagg(cfg: DictConfig) -> None:
    """The pools' settings, before anything is built (nothing to check when aggregated)."""
    disagg = cfg.get("disagg")
    if disagg is None:
        return
    keys = ("prefill", "decode", "prefill_tp", "decode_tp", "prefill_dp", "decode_dp",
            "prefill_max_tokens")  # fmt: skip
    for key in keys:
        if disagg[key] < 0:
            raise ConfigError(f"disagg.{key}={disagg[key]} must be >= 0 (0 = the run's value)")
    for key in ("prefill", "decode"):
        if disagg[key] > MAX_POOL_INSTANCES:
            raise ConfigError(
                f"disagg.{key}={disagg[key]}: a replica's pool holds at most "
                f"{MAX_POOL_INSTANCES} instances; for more load, plan replicas (plan.target_rps)"
            )
    if disagg.decode_max_num_seqs < 0 or disagg.link_gbps < 0:
        key = "decode_max_num_seqs" if disagg.decode_max_num_seqs < 0 else "link_gbps"
        raise ConfigError(f"disagg.{key}={disagg[key]} must be >= 0 (0 = the default)")
    error = policy_error(disagg.router)
    if error:
        raise ConfigError(error)
    if not disaggregated(cfg):
        return
    if not disagg.prefill or not disagg.decode:
        empty = "decode" if not disagg.decode else "prefill"
        raise ConfigError(
            f"disagg.prefill={disagg.prefill} disagg.decode={disagg.decode}: a disaggregated "
            f"deployment needs instances in both pools; set disagg.{empty} >= 1, or both 0 "
            "for one aggregated instance"
        )
    try:
        disagg_path(path_engine(cfg))
    except ValueError as err:
        raise ConfigError(str(err)) from err
    _check_pool_limits(cfg)


def _check_pool_limits(cfg: DictConfig) -> None:
    """Each pool's step holds a full batch of its rows, as the run's limits must
    (pipeline/config/checks.py), the error naming the pool's key."""
    prefill, decode = pool_of(cfg, PREFILL), pool_of(cfg, DECODE)
    if prefill.max_tokens < prefill.max_num_seqs:
        raise ConfigError(
            f"disagg.prefill_max_tokens={prefill.max_tokens} < max_num_seqs="
            f"{prefill.max_num_seqs}: a full batch would not fit one prefill step; raise "
            "disagg.prefill_max_tokens (0 = max_tokens) or lower max_num_seqs"
        )
    if decode.max_tokens < decode.max_num_seqs:
        raise ConfigError(
            f"disagg.decode_max_num_seqs={decode.max_num_seqs} > max_tokens="
            f"{decode.max_tokens}: a full decode batch would not fit one step; lower "
            "disagg.decode_max_num_seqs (0 = max_num_seqs) or raise max_tokens"
        )


def check_layouts(cfg: DictConfig, spec: ModelSpec) -> None:
    """The run's tp, dp and ep are a layout the engines deploy
    (stages/simulator/expert_parallel.py); disaggregated, so is each pool's instance (its
    own tp and dp, ep over them), and each pool's tp splits the model's heads. A one-line
    error naming the key."""
    try:
        check_layout(spec, cfg.tp, ExpertParallel(cfg.ep, cfg.dp, cfg.ep_imbalance))
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if not disaggregated(cfg):
        return
    for role in (PREFILL, DECODE):
        pool = pool_of(cfg, role)
        try:
            spec.check_tp(pool.tp)
        except ValueError as err:
            key = f"disagg.{role}_tp" if cfg.disagg[f"{role}_tp"] else "tp"
            raise ConfigError(f"{key}: {err}") from err
        try:
            check_layout(spec, pool.tp, ExpertParallel(pool.ep, pool.dp, cfg.ep_imbalance))
        except ValueError as err:
            key = f"disagg.{role}_dp" if cfg.disagg[f"{role}_dp"] else "dp"
            raise ConfigError(f"{role} pool ({key}={pool.dp}, tp={pool.tp}): {err}") from err
