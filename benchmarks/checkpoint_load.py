"""Peak memory of loading a Hugging Face checkpoint (model=hf): a generated ~200 MB Llama.

Writes a LlamaForCausalLM folder with random weights into a temporary folder (sharded with
an index file, bf16 by default as released checkpoints are), then loads it in a fresh
interpreter the way `python -m pipeline model=hf` does, and reports how far the peak resident
set (VmHWM, its high-water mark restarted once Paddle and the loader are imported) rises
above the resident set at that point, against the loaded model's size in the compute
dtype. Loading should stay under 1.5x that size.

    python benchmarks/checkpoint_load.py [--stored bfloat16|float16|float32] [--shards 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import paddle
from safetensors.paddle import save_file

from stages.loading.checkpoint import INDEX_FILE, read_spec, weight_plan

# ~55M parameters: 221 MB in float32.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

MEASURE = """
import json, sys, time
import paddle
from pipeline.executors.allocator import keep_freed_memory
from stages.loading.checkpoint import load_hf_model

def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

keep_freed_memory()  # as build_engine does before it builds the model
# Importing Paddle peaks above where it settles: restart the high-water mark here.
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
baseline_kib = status_kib("VmRSS")
start = time.perf_counter()
model = load_hf_model(sys.argv[1], dtype=sys.argv[2], max_position=0)
seconds = time.perf_counter() - start
print(json.dumps({"baseline_kib": baseline_kib, "peak_kib": status_kib("VmHWM"),
                  "seconds": seconds, "model_bytes": model.num_bytes,
                  "parameters": model.num_parameters}))
"""


def generate(folder: Path, stored: str, shards: int, seed: int = 0) -> int:
    """Writes config.json and `shards` safetensors files plus the index; returns the bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**CONFIG, "torch_dtype": stored}))
    names = list(weight_plan(read_spec(CONFIG)).shapes.items())
    rng = np.random.default_rng(seed)
    weight_map, total = {}, 0
    for index, group in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for i in group:
            key, shape = names[i]
            values = rng.standard_normal(shape, dtype=np.float32) * 0.02
            tensors[key] = paddle.to_tensor(values).astype(stored)
            weight_map[key] = file
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        total += (folder / file).stat().st_size
        del tensors
    (folder / INDEX_FILE).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return total


def measure(folder: Path, dtype: str = "float32") -> dict:
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(folder), dtype],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--shards", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        on_disk = generate(folder, args.stored, args.shards)
        m = measure(folder)
    mib = 2**20
    model, rise = m["model_bytes"], (m["peak_kib"] - m["baseline_kib"]) * 1024
    print(f"checkpoint: {args.shards} shards, {args.stored}, {on_disk / mib:.0f} MiB on disk")
    print(f"model: {m['parameters'] / 1e6:.1f}M parameters, {model / mib:.0f} MiB in float32")
    print(f"load: {m['seconds']:.2f} s")
    print(
        f"peak RSS rise while loading: {rise / mib:.0f} MiB = {rise / model:.2f}x the model "
        f"(resident {m['baseline_kib'] / 1024:.0f} MiB after import, peak "
        f"{m['peak_kib'] / 1024:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
