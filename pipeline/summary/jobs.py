"""A sweep's job folders as the summary reads them: each job's overrides, status and
metrics, the figures read beside metrics.json, and the band of a simulated job's figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.run_folder.reader import (
    RunFileError,
    RunStatus,
    read_choices,
    read_mapping,
    read_metrics,
    read_overrides,
    read_step_lines,
)

if TYPE_CHECKING:
    from pipeline.plan.bands import Band

# (column, path into metrics.json): the figures a user tunes a deployment by.
LATENCIES = [("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "itl_ms"), ("e2e", "e2e_ms")]
HEADLINE: list[tuple[str, tuple[str, ...]]] = [
    ("output_throughput", ("output_throughput",)),
    *(
        (f"{name}_{stat}_ms", (key, stat))
        for name, key in LATENCIES
        for stat in ("p50", "p90", "p99")
    ),
    ("tpot_mean_ms", ("tpot_ms", "mean")),
    ("token_utilization", ("token_utilization",)),
    ("num_preemptions", ("num_preemptions",)),
    ("bucket_misses", ("bucket_misses",)),
    ("prefix_cache_hit_rate", ("prefix_cache_hit_rate",)),
    ("warmup_shapes", ("warmup_shapes",)),  # simulated runs only: graphs warmup compiles
    ("predicted_warmup_s", ("predicted_warmup_s",)),  # simulated runs only
    ("serving_compiles", ("serving_compiles",)),  # simulated: graphs compiled while serving
    ("serving_compile_s", ("serving_compile_s",)),
    ("request_goodput", ("request_goodput",)),  # requests/s that met every SLO bound
    ("slo_attainment", ("slo_attainment",)),
    ("busy_fraction", ("busy_fraction",)),  # the device's share of the run in steps
    ("clipped", ("workload_counts", "clipped")),  # trace prompts cut to max_model_len - 1
    ("rejected", ("workload_counts", "rejected")),  # trace prompts refused (too_long=error)
]
# The figures a simulated job predicts from its profile's step times: each carries the band
# (pipeline/plan/bands.py). Counts (graphs, preemptions, padding) are the scheduler's own.
BANDED = frozenset(
    {"output_throughput", "tpot_mean_ms", "request_goodput"}
    | {f"{name}_{stat}_ms" for name, _ in LATENCIES for stat in ("p50", "p90", "p99")}
)
DEFAULT_ENGINE = "native"  # this engine's own step rules: a run that names none


@dataclass
class Job:
    """One job folder of a sweep, as far as the summary needs it."""

    num: int
    path: Path
    overrides: list[str]
    status: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    config: dict[str, Any] = field(default_factory=dict)  # resolved_config.yaml, where read
    engine: str = DEFAULT_ENGINE

    @property
    def band(self) -> Band | None:
        """The band of a simulated job's predicted figures; None for a measured run."""
        if not self.metrics.get("simulated") or not isinstance(self.config.get("hardware"), dict):
            return None  # measured, or no profile to take the band from
        # imported here: pipeline.plan's package reads sweeps through this module
        from pipeline.plan.bands import config_band

        return config_band(self.config)

    def ends(self, column: str) -> tuple[float, float] | None:
        """(low, high) of a banded figure of a simulated job; None where it has no band."""
        if column not in BANDED:
            return None
        value, band = self.value(column), self.band
        if value is None or band is None or not band.relative:
            return None
        low, high = band.ends(float(value))
        return min(low, high), max(low, high)

    @property
    def override_values(self) -> dict[str, str]:
        return dict(split_override(o) for o in self.overrides)

    def value(self, column: str) -> float | None:
        for name, keys in HEADLINE:
            if name == column:
                node: Any = self.metrics
                for key in keys:
                    node = node.get(key) if isinstance(node, dict) else None
                return node if isinstance(node, (int, float)) else None
        raise KeyError(column)


def split_override(override: str) -> tuple[str, str]:
    """`max_tokens=512` -> (`max_tokens`, `512`); a bare `~key` deletion keeps an empty value."""
    key, _, value = override.partition("=")
    return key, value


def _job_number(job_dir: Path, fallback: int) -> int:
    # Hydra records the job's number in hydra.yaml; the folder name is only the default subdir.
    try:
        num = read_mapping(job_dir / ".hydra" / "hydra.yaml")["hydra"]["job"]["num"]
        if isinstance(num, int) and not isinstance(num, bool):
            return num
    except (RunFileError, KeyError, TypeError):
        pass
    return int(job_dir.name) if job_dir.name.isdigit() else fallback


PLAN_JOB_NAME = "plan"  # conf/plan.yaml's hydra.job.name


def made_by_plan(jobs: Sequence[Job]) -> bool:
    """Whether the sweep is a plan's (Hydra's job name, .hydra/hydra.yaml): a plan writes its
    own report.html (pipeline/plan/page.py)."""
    try:
        name = read_mapping(jobs[0].path / ".hydra" / "hydra.yaml")["hydra"]["job"]["name"]
    except (RunFileError, KeyError, TypeError, IndexError):
        return False
    return name == PLAN_JOB_NAME


def read_job(job_dir: Path, fallback_num: int = 0) -> Job:
    """A job's overrides and metrics; a job that never wrote metrics.json is `interrupted`,
    one whose files cannot be read is `unreadable`, with the reason."""
    num = _job_number(job_dir, fallback_num)
    try:
        overrides = read_overrides(job_dir) or []
    except RunFileError as err:
        return Job(num, job_dir, [], "unreadable", error=str(err))
    if not (job_dir / "metrics.json").is_file():  # killed before it could write one
        return Job(num, job_dir, overrides, RunStatus.INTERRUPTED, error="no metrics.json")
    try:
        metrics = read_metrics(job_dir) or {}
    except (OSError, RunFileError) as err:
        return Job(num, job_dir, overrides, "unreadable", error=str(err))
    config = _derived(job_dir, metrics)
    status = str(metrics.get("status", "missing"))
    error = " ".join(str(metrics.get("error") or "").split())  # one line per job in the tables
    return Job(
        num, job_dir, overrides, status, metrics, error, config, _engine(job_dir, config, metrics)
    )


def _derived(job_dir: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """Figures the summary reads beside metrics.json: the device's busy share (steps.jsonl)
    and the bucketing whose grid a simulated run predicts; returns the resolved config
    ({} where it cannot be read)."""
    metrics["busy_fraction"] = busy_fraction(job_dir, metrics)
    try:
        config = read_mapping(job_dir / "resolved_config.yaml")
    except RunFileError:
        return {}
    metadata = config.get("metadata")
    metrics["bucketing"] = metadata.get("bucketing") if isinstance(metadata, dict) else None
    return config


def _engine(job_dir: Path, config: dict[str, Any], metrics: dict[str, Any]) -> str:
    """The engine whose step rules the run predicted: as its metrics.json names it, else its
    `engine` group choice or its config's `engine.name`, else this engine's own."""
    try:
        chosen = read_choices(job_dir).get("engine")
    except RunFileError:
        chosen = None
    node = config.get("engine")
    named = node.get("name") if isinstance(node, dict) else node if isinstance(node, str) else None
    return str(metrics.get("engine") or chosen or named or DEFAULT_ENGINE)


def device_label(metrics: dict[str, Any]) -> str:
    """A simulated job's device and the engine it predicts: `h100 tp2 fp8/fp8 vllm`
    (hardware, tensor parallel, weights' and KV cache's precision, engine); empty for a real
    run."""
    if not metrics.get("simulated"):
        return ""
    precision = f"{metrics.get('quantization', 'none')}/{metrics.get('kv_cache_dtype', 'auto')}"
    engine = metrics.get("engine", DEFAULT_ENGINE)
    return f"{metrics.get('hardware')} tp{metrics.get('tp', 1)} {precision} {engine}"


def bands_said(jobs: Sequence[Job]) -> list[str]:
    """Each simulated device's band and where it comes from, one line a device:
    `gaudi2: +-14% (static held-out median error); figures describe Intel Gaudi 1.21`."""
    said: dict[str, str] = {}
    for job in jobs:
        band = job.band
        device = str(job.metrics.get("hardware") or "")
        if band is None or not device or device in said:
            continue
        release = f"; figures describe {band.software}" if band.software else ""
        said[device] = f"{device}: {band.describe()}{release}"
    return list(said.values())


def engines(jobs: Sequence[Job]) -> list[str]:
    """The engines whose step rules the jobs followed, each once."""
    return sorted({job.engine for job in jobs})


def busy_fraction(job_dir: Path, metrics: Mapping[str, Any]) -> float | None:
    """The share of the run the device spent in steps (its steps' seconds over the run's),
    from steps.jsonl; None where the run kept no steps or they cannot be read (a damaged
    file leaves this figure unknown, not the job unreadable)."""
    path, duration = job_dir / "steps.jsonl", metrics.get("duration_s")
    if not path.is_file() or not duration:
        return None
    try:
        steps = read_step_lines(path)
    except (OSError, RunFileError):
        return None
    return min(sum(step["duration_s"] for step in steps) / duration, 1.0)


def find_jobs(sweep_dir: Path) -> list[Job]:
    """Every job folder under the sweep folder (a job folder holds .hydra/overrides.yaml)."""
    found = sorted(p.parent.parent for p in sweep_dir.glob("**/.hydra/overrides.yaml"))
    found = [p for p in found if p != sweep_dir]  # a single run's folder is not a sweep
    jobs = [read_job(path, i) for i, path in enumerate(found)]
    return sorted(jobs, key=lambda j: (j.num, str(j.path)))


def swept_keys(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose value differs between jobs, in the order they were given."""
    keys: list[str] = []
    for job in jobs:
        keys += [k for k in job.override_values if k not in keys]
    return [k for k in keys if len({j.override_values.get(k, "") for j in jobs}) > 1]
