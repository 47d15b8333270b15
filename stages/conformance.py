"""Each stage's implementations against the contract the engine holds them to
(`stages.interfaces`), checked by the type checker, never imported at run time: a stage that
misses a declared ability, or declares it with another signature, fails `mypy` here."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stages import interfaces as contract
    from stages.forward.metadata import BucketedMetadataBuilder
    from stages.loading.gguf.tokenizer import GgufTokenizer
    from stages.loading.tokenizer import ByteTokenizer, HfTokenizer
    from stages.model.attention import ops_cpu
    from stages.model.attention.interface import AttentionOps
    from stages.model.attention.ops_intel_hpu import IntelHPUOps
    from stages.model.attention.paged import PagedAttention
    from stages.model.attention.reference import ReferenceAttention
    from stages.model.transformer import TransformerLM
    from stages.sampling.sampler import GreedySampler, RandomSampler
    from stages.scheduling.scheduler import ChunkedScheduler
    from stages.scheduling.whole_prompt import WholeScheduler
    from stages.simulator.device import NoAttention, SimulatedDevice, WorkloadLengthSampler
    from stages.simulator.simulation import DeviceSimulation
    from stages.trace import TraceWorkload
    from stages.workload import JsonlWorkload, MixedWorkload, MultiTurnWorkload, SyntheticWorkload

    tokenizers: list[type[contract.Tokenizer]] = [ByteTokenizer, HfTokenizer, GgufTokenizer]
    schedulers: list[type[contract.Scheduler]] = [ChunkedScheduler, WholeScheduler]
    metadata: list[type[contract.MetadataBuilder]] = [BucketedMetadataBuilder]
    attention: list[type[contract.Attention]] = [PagedAttention, ReferenceAttention, NoAttention]
    layers: list[type[contract.LayerAttention]] = [PagedAttention, ReferenceAttention]
    ops: list[AttentionOps] = [ops_cpu, IntelHPUOps(None)]
    model: type[contract.Model[contract.LayerAttention]] = TransformerLM
    device: type[contract.Model[NoAttention]] = SimulatedDevice
    samplers: list[type[contract.Sampler]] = [GreedySampler, RandomSampler, WorkloadLengthSampler]
    # Abilities only a simulated build asks for.
    decode_runs: list[type[contract.AppliesDecodeRuns]] = [ChunkedScheduler, WholeScheduler]
    padding_runs: list[type[contract.PadsDecodeRuns]] = [BucketedMetadataBuilder]
    simulations: list[type[contract.Simulation]] = [DeviceSimulation]
    workloads: list[type[contract.Workload]] = [
        SyntheticWorkload,
        MixedWorkload,
        MultiTurnWorkload,
        JsonlWorkload,
        TraceWorkload,
    ]
