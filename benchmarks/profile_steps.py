"""Where a step's time goes, this engine and the peer side by side, on the same workload.

    python -m benchmarks.profile_steps                          (from the repository root)
    python -m benchmarks.profile_steps --model small --peer-batch 16 max_tokens=4096

Every model forward of this engine runs under Paddle's profiler, one forward at a time;
the peer's modules are timed by hooks (torch.profiler slows its matmuls about tenfold
here, which would misname the gap). Each forward is filed under its phase: this engine's
steps are prefill-only (`extend`), `mixed` or `decode`; the peer's first forward of each
generate() call is its prefill, the rest are decodes. Inside a phase the operators' own
CPU time is summed by kind (matmuls, attention, gathers and copies (a
reshape that has to copy is one), elementwise, other)
from Paddle's operator times and from the peer's module times (a Linear is a matmul, the
attention module's own time is attention, norms and the MLP's multiply are elementwise);
what this engine's forward holds beyond its operators is Python and op-launch overhead
(the peer's is inside its modules' times), and the time outside the forwards is each
side's loop (scheduling, metadata and sampling here; logits processing and input
bookkeeping in generate()).

The profiler's own start and stop are left out of the totals; recording still slows this
engine's operators somewhat, so the shares are the figures to compare.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pipeline  # noqa: F401  # isort: skip  (chooses MKL's code path before Paddle loads it)
import paddle.profiler as paddle_profiler  # isort: skip

from benchmarks.decode_step import read_bandwidth
from benchmarks.floor import matmul_rate, step_flops
from benchmarks.harness import synthetic_overrides
from benchmarks.peer import sorted_batches
from benchmarks.report import write_report
from pipeline.config.compose import compose_config
from pipeline.job.run import build_engine
from stages.forward.step_shape import StepShape
from stages.loading.checkpoint.export import export_hf_llama

KINDS = ("matmul", "attention", "gather/copy", "elementwise", "other")
# Operator names (lower case, either framework) by kind; the first kind that matches wins.
_KIND_WORDS = (
    ("attention", "softmax attention sdpa flash".split()),
    ("matmul", "matmul addmm bmm mm linear dot".split()),
    (
        "gather/copy",
        """gather scatter index index_select slice split concat cat stack unbind copy
        contiguous transpose permute expand tile repeat clone to_tensor full zeros empty
        arange as_complex as_real view_as embedding take_along_axis reshape squeeze
        unsqueeze flatten view""".split(),
    ),
    (
        "elementwise",
        """add mul multiply sub subtract div divide silu rsqrt pow mean neg exp scale cos
        sin where masked_fill sum cast to_copy sigmoid max min argmax cumsum eq ne lt gt
        fill""".split(),
    ),
)


def kind_of(op: str) -> str:
    """An operator's kind: its whole name (namespace and in-place mark dropped), or one of
    its underscore-separated words, is in a kind's list."""
    name = op.lower().rsplit("::", 1)[-1].strip("_")
    words = {name, *name.split("_")}
    for kind, names in _KIND_WORDS:
        if words & set(names):
            return kind
    return "other"


class PhaseProfile:
    """Per phase: forwards, their wall seconds, operator seconds by kind, operator calls."""

    def __init__(self) -> None:
        self.forwards: dict[str, int] = defaultdict(int)
        self.wall: dict[str, float] = defaultdict(float)
        self.ops: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.calls: dict[str, int] = defaultdict(int)
        self.floor: dict[str, float] = defaultdict(float)  # the forwards' roofline seconds
        self.loop_s = 0.0  # the run's wall time outside the forwards
        self.total_s = 0.0  # the run's wall time, the profiler's own start and stop left out
        self.profiler_s = 0.0
        self.tokens = 0

    def add(
        self,
        phase: str,
        wall: float,
        op_seconds: dict[str, float],
        calls: int,
        floor: float = 0.0,
    ) -> None:
        self.forwards[phase] += 1
        self.floor[phase] += floor
        self.wall[phase] += wall
        self.calls[phase] += calls
        for op, seconds in op_seconds.items():  # operator names, or kinds already
            self.ops[phase][op if op in KINDS else kind_of(op)] += seconds

    def rows(self, side: str) -> list[str]:
        lines = []
        for phase in sorted(self.wall, key=lambda p: -self.wall[p]):
            wall, ops, floor = self.wall[phase], self.ops[phase], self.floor[phase]
            launch = wall - sum(ops.values())
            cells = [f"{ops[k]:.2f}" for k in KINDS]
            roofline = f"{floor:.2f} | {wall / floor:.2f}x" if floor else "- | -"
            lines.append(
                f"| {side} | {phase} | {self.forwards[phase]} | {wall:.2f} | {roofline} | "
                + " | ".join(cells)
                + (
                    f" | {launch:.2f} | {self.calls[phase] / self.forwards[phase]:.0f} |"
                    if self.calls[phase]
                    else " | (in the kinds) | - |"
                )
            )
        lines.append(
            f"| {side} | loop outside the forward | - | {self.loop_s:.2f} | - | - | "
            + " | ".join("-" for _ in KINDS)
            + " | - | - |"
        )
        return lines


class Roofline:
    """A forward's least time: the larger of its FLOPs at the matmul rate and the bytes it
    must read (the weights once, every row's cached keys and values once) at the read
    bandwidth, both measured in this process on the model's own shapes."""

    def __init__(self, model, threads: int) -> None:
        self.dims = model.spec
        self.rate = matmul_rate(threads, dims=model.spec)
        self.bandwidth = read_bandwidth()
        self.weight_bytes = model.num_bytes
        d = model.spec
        self.kv_bytes_per_token = 2 * d.num_layers * d.num_kv_heads * d.head_dim * 4

    def seconds(self, shape: StepShape) -> float:
        tokens = [*shape.chunk_lens, *[1] * len(shape.decode_lens)]
        contexts = shape.context_lens or (0,) * len(shape.chunk_lens)
        ends = [c + n for c, n in zip(contexts, shape.chunk_lens, strict=True)]
        ends += list(shape.decode_lens)
        flops = step_flops(self.dims, tokens, ends)
        read = self.weight_bytes + self.kv_bytes_per_token * sum(ends)
        return max(flops / self.rate, read / self.bandwidth)


def _paddle_ops(prof: paddle_profiler.Profiler) -> tuple[dict[str, float], int]:
    """Operator name -> CPU seconds and the number of operator calls, of one profile."""
    from paddle.profiler.profiler_statistic import StatisticData

    result = prof.profiler_result
    stats = StatisticData(result.get_data(), result.get_extra_info())
    seconds, calls = {}, 0
    for name, item in stats.event_summary.items.items():
        seconds[name.replace(" dygraph", "")] = item.cpu_time / 1e9
        calls += item.call
    return seconds, calls


def profile_engine(overrides: list[str]) -> tuple[PhaseProfile, object]:
    cfg = compose_config(overrides)
    engine, requests = build_engine(cfg)
    roofline = Roofline(engine.model, cfg.num_threads)
    profile = PhaseProfile()
    forward = engine.model.forward

    def profiled(meta, attention):
        prof = paddle_profiler.Profiler(
            targets=[paddle_profiler.ProfilerTarget.CPU], on_trace_ready=lambda _: None
        )
        begin = time.perf_counter()
        prof.start()
        start = time.perf_counter()
        logits = forward(meta, attention)
        float(logits[0, 0])
        wall = time.perf_counter() - start
        prof.stop()
        profile.add(meta.mode, wall, *_paddle_ops(prof), roofline.seconds(meta.shape))
        profile.profiler_s += time.perf_counter() - begin - wall
        return logits

    engine.model.forward = profiled
    start = time.perf_counter()
    engine.run(requests)
    profile.total_s = time.perf_counter() - start - profile.profiler_s
    profile.loop_s = profile.total_s - sum(profile.wall.values())
    profile.tokens = sum(len(r.output_ids) for r in requests)
    return profile, (engine, requests, roofline)


# The peer's modules by kind: torch.profiler slows its matmuls about tenfold here, so the
# peer is timed by module hooks instead, each module's own time (its timed children's taken
# out) filed under a kind; its Python overhead is then inside each module's time.
_PEER_KINDS = {
    "Linear": "matmul",
    "LlamaAttention": "attention",  # rotary, the cache's concatenation, SDPA, reshapes
    "LlamaRMSNorm": "elementwise",
    "SiLUActivation": "elementwise",
    "LlamaMLP": "elementwise",  # silu(gate) * up
    "LlamaDecoderLayer": "elementwise",  # the residual adds
    "LlamaRotaryEmbedding": "elementwise",  # cos and sin of the positions
    "Embedding": "gather/copy",
}


def _module_timers(model, totals: dict[str, float]) -> None:
    """Hooks adding each module's own seconds (less its children's) to totals[kind]."""
    stack: list[list[float]] = []  # per open module: [start, children's seconds]

    def before(module, _args) -> None:
        stack.append([time.perf_counter(), 0.0])

    def after(module, _args, _out) -> None:
        start, children = stack.pop()
        elapsed = time.perf_counter() - start
        if stack:
            stack[-1][1] += elapsed
        totals[_PEER_KINDS.get(type(module).__name__, "other")] += elapsed - children

    for module in model.modules():
        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)


def profile_peer(folder: Path, prompts: list[list[int]], new_tokens: int, batch: int, pad: int):
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    profile = PhaseProfile()
    totals: dict[str, float] = defaultdict(float)
    _module_timers(model, totals)
    forward = model.forward
    calls_in_batch = [0]

    def profiled(*args, **kwargs):
        phase = "prefill" if calls_in_batch[0] == 0 else "decode"
        calls_in_batch[0] += 1
        totals.clear()
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        wall = time.perf_counter() - start
        profile.add(phase, wall, dict(totals), 0)
        return out

    model.forward = profiled
    with torch.inference_mode():
        ids, mask, _ = next(sorted_batches(prompts[:batch], batch, pad))  # untimed warm-up
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
        for table in (profile.wall, profile.ops, profile.forwards):
            table.clear()
        start = time.perf_counter()
        for ids, mask, _ in sorted_batches(prompts, batch, pad):
            calls_in_batch[0] = 0
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
            profile.tokens += out.shape[0] * (out.shape[1] - ids.shape[1])
    profile.total_s = time.perf_counter() - start
    profile.loop_s = profile.total_s - sum(profile.wall.values())
    return profile


def report(
    args: argparse.Namespace, ours: PhaseProfile, peer: PhaseProfile, roofline: Roofline
) -> list[str]:
    """The markdown table; the peer's rows and figures only when it was profiled."""
    header = " | ".join(f"{k} s" for k in KINDS)
    with_peer = peer.total_s > 0
    peer_title = f"; peer sorted by length in batches of {args.peer_batch}" if with_peer else ""
    peer_figures = (
        f", the peer {peer.total_s:.2f} s ({peer.tokens / peer.total_s:.0f} tok/s)"
        if with_peer
        else ""
    )
    return [
        f"### Profile, model={args.model}: {args.requests} requests, prompts "
        f"{args.min_prompt}-{args.max_prompt}, {args.new_tokens} new tokens, "
        f"{args.threads} threads{peer_title}",
        "",
        f"Under the profilers: this engine {ours.total_s:.2f} s ({ours.tokens / ours.total_s:.0f}"
        f" tok/s){peer_figures}. "
        "Seconds summed over the run; launch = the forward's wall time beyond its operators' "
        "own time (Python, dispatch); ops = operator calls per forward. Roofline = the "
        "forwards' least time, the larger of their FLOPs at the matmul rate "
        f"({roofline.rate / 1e9:.0f} GFLOP/s on the model's shapes) and their reads (weights "
        f"once, every row's cached keys and values once) at {roofline.bandwidth / 1e9:.1f} GB/s; "
        f"this engine's forwards: {sum(ours.wall.values()):.2f} s over a roofline of "
        f"{sum(ours.floor.values()):.2f} s.",
        "",
        f"| side | phase | forwards | wall s | roofline s | wall / roofline | {header} "
        "| launch s | ops |",
        "| --- | --- | ---: | ---: | ---: | ---: | "
        + " | ".join("---:" for _ in KINDS)
        + " | ---: | ---: |",
        *ours.rows("this engine"),
        *(peer.rows("peer") if with_peer else []),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-batch", type=int, default=16)
    parser.add_argument("--skip-peer", action="store_true", help="profile this engine only")
    parser.add_argument("--out", type=Path, help="append the markdown table to this file")
    parser.add_argument("overrides", nargs="*", help="pipeline overrides, e.g. max_tokens=4096")
    args = parser.parse_args()
    overrides = [
        *synthetic_overrides(
            args.requests, args.min_prompt, args.max_prompt, args.new_tokens, args.threads
        ),
        f"model={args.model}",
        *args.overrides,
    ]
    ours, (engine, requests, roofline) = profile_engine(overrides)
    peer = PhaseProfile()
    if not args.skip_peer:
        import torch

        torch.set_num_threads(args.threads)
        prompts = [r.prompt_ids for r in sorted(requests, key=lambda r: r.index)]
        with tempfile.TemporaryDirectory() as folder:
            export_hf_llama(engine.model, folder)
            peer = profile_peer(
                Path(folder), prompts, args.new_tokens, args.peer_batch, engine.tokenizer.pad_id
            )
    text = "\n".join(report(args, ours, peer, roofline)) + "\n"
    print(text)
    if args.out:
        write_report(args.out, text)


if __name__ == "__main__":
    main()
