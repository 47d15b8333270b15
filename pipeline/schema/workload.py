"""Schemas of the `workload` options: synthetic, mixed, multi-turn, a JSONL file of requests
and a trace file."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import II, MISSING

from stages.trace.formats import TraceFormat
from stages.trace.workload import TooLong


@dataclass
class WorkloadConf:
    _target_: str = MISSING
    concurrency: int = 0  # most requests in flight (closed loop); 0 = open loop


@dataclass
class SyntheticWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.SyntheticWorkload"
    num_requests: int = 16
    min_prompt_tokens: int = 16
    max_prompt_tokens: int = 1200
    min_new_tokens: int = 8
    max_new_tokens: int = 32
    ignore_eos: bool = True
    rate: float = 0.0  # Poisson arrivals, requests/s; 0 = all at once
    start_s: float = 0.0  # arrivals begin here, seconds after the start
    seed: int = II("seed")
    shared_prefix_tokens: int = 0  # each prompt starts with a shared prefix this long; 0 = none
    num_prefixes: int = 1  # distinct shared prefixes; request i has prefix i mod this


@dataclass
class MixedWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.MixedWorkload"
    parts: dict[str, SyntheticWorkloadConf] = field(default_factory=dict)


@dataclass
class MultiTurnWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.MultiTurnWorkload"
    num_conversations: int = 8
    turns: int = 4  # each turn's prompt: the previous prompt, its answer and a new question
    system_prompt_tokens: int = 256
    min_question_tokens: int = 16
    max_question_tokens: int = 64
    min_answer_tokens: int = 16  # the recorded answer's length is the turn's max_new_tokens
    max_answer_tokens: int = 64
    rate: float = 0.0  # conversations start as a Poisson process, per second; 0 = all at once
    turn_gap_s: float = 1.0  # a turn arrives this long after the previous one
    seed: int = II("seed")


@dataclass
class JsonlWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.JsonlWorkload"
    path: str = MISSING  # a jsonl file, one request per line
    num_requests: int = 0  # 0 = every line
    max_new_tokens: int = 64  # for lines that do not say
    rate: float = 0.0  # Poisson arrivals when lines give no arrival_s
    seed: int = II("seed")
    max_model_len: int = II("max_model_len")  # a longer line is refused unread


@dataclass
class TraceWorkloadConf(WorkloadConf):
    _target_: str = "stages.trace.TraceWorkload"
    path: str = MISSING  # a trace file the user brings (docs/traces.md)
    format: TraceFormat = TraceFormat.auto  # auto, azure, burstgpt, mooncake, sharegpt, vidur
    model_filter: str = ""  # burstgpt: keep this model's rows; "" = all
    trace_block_size: int = 512  # mooncake: tokens per hash id
    time_scale: float = 1.0  # multiplies the gaps between arrivals
    start_s: float = 0.0  # window start, trace seconds after the shift
    duration_s: float = 0.0  # window length; 0 = to the end
    num_requests: int = 0  # the first N; 0 = all
    rate: float = 0.0  # sharegpt (no timestamps): Poisson arrivals, requests/s; 0 = all at once
    too_long: TooLong = TooLong.clip  # clip or error: prompts longer than max_model_len - 1
    seed: int = II("seed")
    max_model_len: int = II("max_model_len")
    max_num_seqs: int = II("max_num_seqs")


SCHEMAS: dict[tuple[str, str], type] = {
    ("workload", "synthetic"): SyntheticWorkloadConf,
    ("workload", "jsonl"): JsonlWorkloadConf,
    ("workload", "mixed"): MixedWorkloadConf,
    ("workload", "multiturn"): MultiTurnWorkloadConf,
    ("workload", "trace"): TraceWorkloadConf,
}
