"""Inputs that used to hang the run, end it in a traceback, or be accepted and give wrong
figures: each is now bounded, refused with one line naming the file and field, or ends only
its own request."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import yaml

from pipeline import inspect
from pipeline.config.checks import ConfigError
from pipeline.executors.build import load_workload
from pipeline.profiles import measured_profile
from pipeline.schema import HardwareConf
from stages.loading.tokenizer import ByteTokenizer
from stages.simulator.hardware import HardwareProfile, read_profile
from stages.workload import MAX_ARRIVAL_S
from tests.helpers import REPO, make_config, schema_kwargs, trace_workload
from tests.test_inspect import folder_of

VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def vidur(tmp_path: Path, *arrivals: float) -> Path:
    path = tmp_path / f"trace-{len(list(tmp_path.glob('trace-*')))}.csv"
    path.write_text(VIDUR + "".join(f"{t!r},10,3\n" for t in arrivals))
    return path


# ------------------------------------------------------------------------------- hangs


def workloads(tmp_path: Path) -> dict[str, tuple[list[str], list[float]]]:
    """Overrides and the arrivals (in seconds from the first) they give, beyond a day or not."""
    trace = ["workload=trace", f"workload.path={vidur(tmp_path, 0.0, 5.0, 1e9)}"]
    return {
        "trace, a year-long gap": (trace, [0.0, 5.0, 1e9]),
        "trace, scaled": (
            [
                "workload=trace",
                f"workload.path={vidur(tmp_path, 0.0, 1.0, 2.0)}",
                "workload.time_scale=1e5",
            ],
            [0.0, 1e5, 2e5],
        ),  # fmt: skip
        "trace, an arrival of -1e308": (
            ["workload=trace", f"workload.path={vidur(tmp_path, -1e308, 0.0)}"],
            [0.0, 1e308],
        ),
        "multi-turn, turn gaps": (
            [
                "workload=multiturn",
                "workload.num_conversations=1",
                "workload.turns=3",
                "workload.turn_gap_s=5e4",
                "workload.system_prompt_tokens=4",
            ],
            [0.0, 5e4, 1e5],
        ),  # fmt: skip
    }


@pytest.mark.parametrize(
    "case",
    [
        "trace, a year-long gap",
        "trace, scaled",
        "trace, an arrival of -1e308",
        "multi-turn, turn gaps",
    ],
)
def test_every_workload_ends_requests_arriving_after_a_day(tmp_path, case):
    overrides, arrivals = workloads(tmp_path)[case]
    _, requests = load_workload(make_config(overrides), ByteTokenizer(add_bos=True))
    assert len(requests) == len(arrivals)
    for request, arrival in zip(requests, arrivals, strict=True):
        late = arrival > MAX_ARRIVAL_S
        assert (request.error is not None and "first day" in request.error) == late, arrival
        assert late or request.arrival_s == pytest.approx(arrival)


def test_a_fifo_named_safetensors_is_not_opened_by_inspect(tmp_path, capsys):
    folder = folder_of(tmp_path)
    for shard in folder.glob("*.safetensors"):
        shard.unlink()
    os.mkfifo(folder / "model-00001-of-00002.safetensors")  # opening it would block
    (folder / "model.safetensors.index.json").unlink()
    code = inspect.main([str(folder), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "is not a regular file" in report["reason"]


def profile_text(**changes) -> str:
    fields = yaml.safe_load((REPO / "conf" / "hardware" / "gaudi3.yaml").read_text())
    fields = {k: v for k, v in fields.items() if k != "defaults"}
    return yaml.safe_dump({**fields, **changes})


def test_a_profile_larger_than_any_real_one_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "w") as f:
        f.write(profile_text())
        f.truncate(100 * 2**20)  # 100 MiB, sparse: nothing is written
    with pytest.raises(ValueError, match=r"is 100.0 MiB, more than the 4 MiB"):
        measured_profile(path)


# ------------------------------------------------------------------ profile values


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"step_overhead_s": float("nan")}, "hardware.step_overhead_s=nan is not a finite"),
        ({"compile_s": float("inf")}, "hardware.compile_s=inf is not a finite"),
        ({"coefficients": {"gemm": float("nan")}}, "hardware.coefficients.gemm=nan"),
        ({"pads_to_buckets": "no"}, "hardware.pads_to_buckets='no' is not a boolean"),
        ({"hbm_capacity_gib": 1e15}, "hardware.hbm_capacity_gib=1e+15 must be in (0, 16384]"),
        ({"bf16_tflops": "fast"}, "hardware.bf16_tflops='fast' is not a number"),
        ({"name": ["a", "list"]}, "hardware.name=['a', 'list'] must be a name"),
        ({"gemm_efficiency": True}, "hardware.gemm_efficiency=True is not a number"),
    ],
)
def test_profile_fields_are_checked_by_type_and_range(tmp_path, changes, message):
    path = tmp_path / "profile.yaml"
    path.write_text(profile_text(**changes))
    with pytest.raises(ValueError) as err:
        measured_profile(path)
    assert str(err.value).startswith(f"hardware.path={path}: ") and message in str(err.value)


def test_a_written_profile_reads_back():
    fields = yaml.safe_load(profile_text())
    assert read_profile  # the same checks hold for a profile composed by Hydra
    assert HardwareProfile(**schema_kwargs(HardwareConf, **fields)).pads_to_buckets is True


def test_a_composed_profile_with_a_nan_is_refused():
    with pytest.raises(ConfigError):
        from pipeline.executors import build_engine

        build_engine(make_config(["executor=simulated", "hardware.step_overhead_s=nan"]))


def workers_of(pid: int) -> list[int]:
    """The loky worker processes whose parent is `pid`, from /proc (its resource trackers,
    which exit on their own once their pipe closes, are left out)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"LokyProcess" in command:
            kids.append(int(stat.parent.name))
    return kids


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_stops_its_workers_and_summarises(tmp_path):
    from tests.test_resume import WORK, start, wait_for_lines

    sweep = tmp_path / "sweep"
    launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    proc = start(tmp_path, "-m", *launcher, f"hydra.sweep.dir={sweep}", "seed=0,1,2,3", *WORK)
    wait_for_lines(sweep / "0" / "generations.jsonl", 1, proc)
    workers = workers_of(proc.pid)
    assert workers
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    assert not [pid for pid in workers if running(pid)]  # stopped with the sweep, not orphaned
    summary = (sweep / "summary.md").read_text()
    assert "| 0 | `seed=0` |" in summary  # the jobs that started, each with its status


# ------------------------------------------------------------ traces: one request each


def test_a_one_line_sharegpt_file_gives_each_entry_its_own_id(tmp_path):

    entry = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    path = tmp_path / "one.json"
    path.write_text(json.dumps([entry, entry, {**entry, "id": "line-1.2"}, entry]))
    requests = trace_workload(path).load(ByteTokenizer(add_bos=True))
    ids = [r.id for r in requests]
    assert len(set(ids)) == 4 and ids[:2] == ["line-1", "line-1.2"]


def test_a_sharegpt_entry_nested_beyond_the_stack_is_its_error(tmp_path):

    entry = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    path = tmp_path / "deep.json"
    path.write_text("[" + json.dumps(entry) + ",\n" + "[" * 100_000 + "]" * 100_000 + "]")
    requests = trace_workload(path).load(ByteTokenizer(add_bos=True))
    assert requests[0].error is None and "bad JSON" in requests[1].error


@pytest.mark.parametrize("fmt", ["vidur", "mooncake", "sharegpt"])
def test_a_byte_that_is_not_utf8_ends_only_its_row(tmp_path, fmt):

    if fmt == "vidur":
        body = (VIDUR + "0,10,3\n1,1\xff0,3\n2,12,3\n").encode("latin-1")
    elif fmt == "mooncake":
        row = '{"timestamp": %d, "input_length": 10, "output_length": 3, "hash_ids": []%s}\n'
        body = (row % (0, "") + row % (1, ', "x": "\xff"') + row % (2, "")).encode("latin-1")
    else:
        turn = (
            '{"conversations": [{"from": "human", "value": "%s"}, {"from": "gpt", "value": "y"}]}'
        )
        body = ("[" + turn % "a" + ",\n" + turn % "b\xff" + ",\n" + turn % "c" + "]").encode(
            "latin-1"
        )
    path = (
        tmp_path
        / f"trace.{'json' if fmt == 'sharegpt' else 'jsonl' if fmt == 'mooncake' else 'csv'}"
    )
    path.write_bytes(body)
    requests = trace_workload(path, format=fmt).load(ByteTokenizer(add_bos=True))
    assert [r.error is None for r in requests] == [True, False, True]
    assert "line" in requests[1].error and "not valid UTF-8" in requests[1].error


def test_a_mooncake_first_line_over_64_kib_is_read(tmp_path):

    entry = {"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [7] * 40_000}
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(entry) + "\n")
    for fmt in ("mooncake", "auto"):
        assert trace_workload(path, format=fmt).format == "mooncake"


def test_counts_and_offsets_no_trace_can_hold_are_that_rows_error(tmp_path):

    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0000000,10,3\n"
        "2023-11-16 18:15:47.0000000,99999999999999999999,3\n"
        "2023-11-16 18:15:48.0000000+99:99,10,3\n"
    )
    requests = trace_workload(path).load(ByteTokenizer(add_bos=True))
    assert requests[0].error is None
    assert "ContextTokens=99999999999999999999 is more tokens" in requests[1].error
    assert "+99:99" in requests[2].error


def test_a_header_only_trace_says_it_has_no_rows(tmp_path):

    path = tmp_path / "empty.csv"
    path.write_text(VIDUR)
    with pytest.raises(ValueError, match="has no rows: give a trace with requests"):
        trace_workload(path)


def test_a_trace_gone_before_the_read_is_one_line(tmp_path, monkeypatch):
    import stages.trace.workload

    def gone(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(stages.trace.workload, "read_csv_trace", gone)
    with pytest.raises(ValueError, match="cannot be read: No such file or directory"):
        trace_workload(vidur(tmp_path, 0.0))


@pytest.mark.parametrize("key", ["seed", "workload.seed", "model.seed"])
def test_a_negative_seed_names_its_key(key):
    from pipeline.config.checks import check_bounds

    with pytest.raises(ConfigError, match=rf"^{key}=-1: a seed must be a whole number >= 0"):
        check_bounds(make_config([f"{key}=-1"]))


def test_inspect_does_not_call_a_bad_tokenizer_json_servable(tmp_path, capsys):
    folder = folder_of(tmp_path)
    (folder / "tokenizer.json").write_text("{not json")
    code = inspect.main([str(folder), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "tokenizer.json is not valid JSON" in report["reason"]


def test_an_infinite_number_in_a_checkpoint_config_is_named(tmp_path, capsys):
    folder = folder_of(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rope_theta": math.inf}))
    assert inspect.main([str(folder), "--json"]) == 1
    assert "rope_theta=inf is not a finite number" in json.loads(capsys.readouterr().out)["reason"]


def test_a_workload_file_gone_before_the_read_is_one_line(tmp_path, monkeypatch):
    import pipeline.executors.build

    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a"}\n')
    real_build = pipeline.executors.build.build

    def build_then_remove(node, **kwargs):
        workload = real_build(node, **kwargs)  # its constructor found the file
        path.unlink()
        return workload

    monkeypatch.setattr(pipeline.executors.build, "build", build_then_remove)
    cfg = make_config(["workload=jsonl", f"workload.path={path}"])
    with pytest.raises(ConfigError, match=rf"workload: {path} cannot be read \(No such file"):
        load_workload(cfg, ByteTokenizer(add_bos=True))
