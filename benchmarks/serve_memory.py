"""The server with a memory sampler beside it: where a soak's resident memory goes.

    python -m benchmarks.serve_memory --out memory.jsonl --every-s 30 -- \\
        model=tiny max_num_seqs=64 serve.port=8000
    python -m benchmarks.serve_load --url http://127.0.0.1:8000 --concurrency 64 \\
        --duration-s 600 --disconnect-fraction 0.1 --input-len 200 --output-len 64

Runs `python -m pipeline.serve OVERRIDES` in this process with a thread that, every
--every-s seconds, collects garbage and writes one JSON line: the resident size, glibc's
heap (`mallinfo2`: bytes in use, free in its arenas, the arenas' size), the collector's
live objects, and the ten types that grew most since the second sample. With --trim it
then calls malloc_trim(0) and records the resident size after it too: what of the
growth is free heap glibc kept. Stop the server with Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import sys
import threading
import time
from pathlib import Path


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def resident_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def sample_forever(out: Path, every_s: float, trim: bool) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    start, base = time.monotonic(), None
    for i in range(sys.maxsize):
        time.sleep(every_s)
        gc.collect()
        heap = libc.mallinfo2()
        types = collections.Counter(type(o).__name__ for o in gc.get_objects())
        line = {
            "t_s": round(time.monotonic() - start),
            "rss_mib": round(resident_mib(), 1),
            "heap_in_use_mib": round(heap.uordblks / 2**20, 1),
            "heap_free_mib": round(heap.fordblks / 2**20, 1),
            "heap_arenas_mib": round(heap.arena / 2**20, 1),
            "live_objects": sum(types.values()),
        }
        if i == 1:
            base = types
        elif base is not None:
            line["grew_most"] = (types - base).most_common(10)
        if trim:
            libc.malloc_trim(0)
            line["rss_after_trim_mib"] = round(resident_mib(), 1)
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.serve_memory", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    p.add_argument("--every-s", type=float, default=30.0)
    p.add_argument("--trim", action="store_true", help="malloc_trim(0) after each sample")
    p.add_argument("overrides", nargs="*", help="python -m pipeline.serve's overrides")
    args = p.parse_args()
    sampler = threading.Thread(
        target=sample_forever, args=(args.out, args.every_s, args.trim), daemon=True
    )
    sampler.start()
    sys.argv = ["pipeline.serve", *args.overrides]
    from pipeline.serve.__main__ import COMMAND as serve

    serve.main()


if __name__ == "__main__":
    main()
