"""What a launch script says about the run it came from: whether the run simulated this
server at all (engine=), the one warmup figure of the configuration, the shapes the run
compiled while serving, and a warmup too long to wait for."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.deploy.settings import Deployment

NATIVE = "native"


def simulated_note(d: Deployment, engine: str, server: str) -> list[str]:
    """Whether the run predicted this server (engine=ENGINE) or this tool's own engine."""
    if d.engine == engine and d.engine_release:
        return [f"# OLDER RELEASE: the run simulated {d.engine_release} (engine={engine}'s "
                "profile of it), and this script's flags are the current release's; the "
                "figures below describe that release, not this server."]  # fmt: skip
    if d.engine == engine:
        return [f"# The run simulated this server (engine={engine}): its prompt cap, warmup "
                "grid and compiles are what the figures below predict."]  # fmt: skip
    return [
        f"# NOT SIMULATED: the run predicted engine={d.engine}, this tool's own scheduler and "
        f"bucket grids, not {server}; its figures do not carry over to this script. Run "
        f"again with engine={engine} to predict this server."
    ]


def warmup_line(graphs: int, unit: str, d: Deployment) -> str:
    """The configuration's one warmup figure: its graphs and hours at the profile's
    compile_s, said impractical past plan.max_warmup_s."""
    seconds = graphs * d.compile_s
    line = (
        f"# Warmup: {graphs:,} {unit}, about {seconds / 3600:.1f} h at {d.compile_s:g} s each "
        "(the hardware profile's compile_s)"
    )
    if d.max_warmup_s and seconds > d.max_warmup_s:
        return (
            f"{line}: IMPRACTICAL, past plan.max_warmup_s={d.max_warmup_s:g} s; plan a smaller "
            "set (python -m pipeline.buckets plan RUN --max-warmup S) or serve without warmup."
        )
    return line + "."


def serving_compiles_lines(d: Deployment, simulated: bool) -> list[str]:
    """The shapes the run compiled while serving (its metrics.json), where it simulated
    this server; nothing where the run is not known or compiled nothing."""
    p = d.predicted
    if p is None or not simulated or not p.serving_compiles:
        return []
    return [
        f"# The run predicted {p.serving_compiles:,} shapes compiled while serving "
        f"({p.serving_compile_s:,.0f} s of its serving time): requests beyond the warmed "
        "shapes compile at first use."
    ]


def model_len_lines(d: Deployment, simulated: bool) -> list[str]:
    """HPU_WARMUP_MODEL_LEN below --max-model-len: the lengths past it compile while
    serving, with the count the run predicted where it simulated FastDeploy."""
    warm = d.fastdeploy.warmup_model_len
    if warm >= d.max_model_len:
        return []
    p = d.predicted
    known = (
        f"the run predicted {p.serving_compiles:,} shapes compiled while serving "
        f"({p.serving_compile_s:,.0f} s)"
        if p is not None and simulated
        else "the run did not simulate them (engine=fastdeploy does)"
    )
    return [
        f"# HPU_WARMUP_MODEL_LEN={warm} < --max-model-len {d.max_model_len}: FastDeploy warms "
        f"lengths up to {warm} tokens only; longer prompts and decodes compile while serving: "
        f"{known}. Set metadata.fastdeploy.warmup_model_len={d.max_model_len} to warm them."
    ]
