"""Structured-config schemas: every group option's keys and types, checked at composition.

Each YAML option in conf/ names its schema (group `schema/<group>`) first in its defaults
list, so a misspelt key, a wrong type, a value outside a closed set or a missing value fails
with Hydra's own message before anything runs. One module per group of schemas, each with
the ConfigStore entries (`SCHEMAS`) of its own; a schema holds values only.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

# The target run folders written before pipeline.profiles name for hardware=measured.
from pipeline.profiles import measured_profile
from pipeline.schema import engine, hardware, model, pipeline, stages, workload
from pipeline.schema.engine import EngineConf, EngineDeviceConf, EngineName
from pipeline.schema.hardware import HardwareConf, MeasuredHardwareConf, schema_defaults
from pipeline.schema.model import (
    COMPUTE_DTYPE,
    MODEL_OPTIONS,
    GgufModelConf,
    HfModelConf,
    ModelOption,
    SpecModelConf,
    TransformerConf,
    model_kind,
    model_option,
)
from pipeline.schema.pipeline import (
    DisaggConf,
    Executor,
    PaddleExecutorConf,
    PipelineConf,
    SimulatedExecutorConf,
    SpeculativeConf,
    SpeculativeMethod,
    schema_view,
)
from pipeline.schema.plan import CalibrateConf, CapacityConf, Objective, PlanConf, SloConf
from pipeline.schema.serve import ServeConf
from pipeline.schema.stages import (
    DEVICE_DEFAULTS,
    BucketAxisConf,
    BucketedMetadataConf,
    ByteTokenizerConf,
    ChunkedSchedulerConf,
    FastDeployWarmupConf,
    GgufTokenizerConf,
    GreedySamplerConf,
    HfTokenizerConf,
    PagedAttentionConf,
    RandomSamplerConf,
    ReferenceAttentionConf,
    SamplerConf,
    SchedulerConf,
    StaticSchedulerConf,
    WholeSchedulerConf,
    device_default,
)
from pipeline.schema.workload import (
    JsonlWorkloadConf,
    MixedWorkloadConf,
    MultiTurnWorkloadConf,
    SyntheticWorkloadConf,
    TraceWorkloadConf,
    WorkloadConf,
)

# Every group option's schema by (group, name): `/schema/<group>@_here_: <name>` in conf/.
SCHEMAS: dict[tuple[str, str], type] = {
    **stages.SCHEMAS,
    **model.SCHEMAS,
    **hardware.SCHEMAS,
    **workload.SCHEMAS,
    **pipeline.SCHEMAS,
    **engine.SCHEMAS,
}


def register_schemas() -> None:
    if not OmegaConf.has_resolver("device_default"):
        OmegaConf.register_new_resolver("device_default", device_default)
    store = ConfigStore.instance()
    store.store(name="pipeline_schema", node=PipelineConf)
    for (group, name), node in SCHEMAS.items():
        store.store(group=f"schema/{group}", name=name, node=node)


__all__ = [
    "COMPUTE_DTYPE",
    "DEVICE_DEFAULTS",
    "MODEL_OPTIONS",
    "SCHEMAS",
    "BucketAxisConf",
    "ByteTokenizerConf",
    "CalibrateConf",
    "CapacityConf",
    "ChunkedSchedulerConf",
    "DisaggConf",
    "EngineConf",
    "EngineDeviceConf",
    "EngineName",
    "Executor",
    "FastDeployWarmupConf",
    "GgufModelConf",
    "GgufTokenizerConf",
    "GreedySamplerConf",
    "BucketedMetadataConf",
    "HardwareConf",
    "HfModelConf",
    "HfTokenizerConf",
    "JsonlWorkloadConf",
    "MeasuredHardwareConf",
    "MixedWorkloadConf",
    "ModelOption",
    "MultiTurnWorkloadConf",
    "Objective",
    "PaddleExecutorConf",
    "PagedAttentionConf",
    "PipelineConf",
    "PlanConf",
    "RandomSamplerConf",
    "ReferenceAttentionConf",
    "SamplerConf",
    "SchedulerConf",
    "ServeConf",
    "SimulatedExecutorConf",
    "SloConf",
    "SpecModelConf",
    "SpeculativeConf",
    "SpeculativeMethod",
    "StaticSchedulerConf",
    "SyntheticWorkloadConf",
    "TraceWorkloadConf",
    "TransformerConf",
    "WholeSchedulerConf",
    "WorkloadConf",
    "device_default",
    "model_kind",
    "schema_view",
    "measured_profile",
    "model_option",
    "register_schemas",
    "schema_defaults",
]
