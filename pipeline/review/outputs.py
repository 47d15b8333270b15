"""Two runs' generated tokens, request by request: identical, or where they part."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.review.runs import Run, request_key, workload_digest

# Tokens shown around a divergence: enough to recognise the text, short enough for a line.
CONTEXT_TOKENS = 8
CONTINUATION_TOKENS = 12


def _decoder(run: Run):
    """The run's own tokenizer when it can be built here; otherwise token ids are shown."""
    node = run.config.get("tokenizer")
    if not isinstance(node, dict) or "_target_" not in node:
        return None
    try:
        from hydra.utils import instantiate

        return instantiate(node).decode
    except Exception:  # e.g. a tokenizer.path that exists only on the machine that ran it
        return None


def _show(decode, ids: Sequence[int]) -> str:
    """The token ids, and their text where the tokenizer is at hand: a byte-level
    tokenizer's text alone can be unreadable bytes."""
    if decode is None:
        return str(list(ids))
    return f"{list(ids)} {decode(list(ids))!r}"  # repr: control bytes, trailing spaces seen


def _workload_difference(a: Run, b: Run) -> str | None:
    """Why the two runs did not serve the same requests, or None. An unfinished run (killed
    or interrupted) may lack requests; the ones both have must still be the same."""
    if workload_digest(a.generations) == workload_digest(b.generations):
        return None
    gen_a = {g.get("id"): g for g in a.generations}
    gen_b = {g.get("id"): g for g in b.generations}
    for rid in gen_a.keys() & gen_b.keys():
        ka, kb = request_key(gen_a[rid]), request_key(gen_b[rid])
        if None in (ka["max_new_tokens"], kb["max_new_tokens"]):  # a folder from before limits
            ka["max_new_tokens"] = kb["max_new_tokens"] = None
        if ka != kb:
            return f"the runs serve different workloads (request {rid} differs)"
    if a.complete and b.complete:
        return (
            f"the runs serve different workloads ({len(gen_a)} vs {len(gen_b)} requests, "
            f"{len(gen_a.keys() & gen_b.keys())} in common)"
        )
    return None


def outputs_verdict(a: Run, b: Run) -> dict[str, Any]:
    """Compares the generated tokens request by request, matched by id; a simulated
    run's tokens are placeholders (no forward pass), so they are not compared."""
    simulated = [side for side, run in (("A", a), ("B", b)) if run.metrics.get("simulated")]
    if simulated:
        return {"comparable": False, "placeholders": True, "reason": (
            f"{' and '.join(simulated)} ran on the simulated device, whose tokens are "
            "placeholders (no forward pass): equal tokens would mean nothing"
        )}  # fmt: skip
    reason = _workload_difference(a, b)
    gen_a = {g["id"]: g for g in a.generations}
    gen_b = {g["id"]: g for g in b.generations}
    if reason is not None:
        return {"comparable": False, "reason": reason}

    decode = _decoder(a)
    ids = [*gen_a, *(i for i in gen_b if i not in gen_a)]
    differences = []
    for rid in ids:
        if rid not in gen_a or rid not in gen_b:
            only = "B" if rid not in gen_a else "A"
            differences.append({"id": rid, "position": None, "note": f"only in {only}"})
            continue
        ta, tb = gen_a[rid].get("output_ids") or [], gen_b[rid].get("output_ids") or []
        if ta == tb:
            continue
        pos = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
        pos = min(len(ta), len(tb)) if pos is None else pos  # one is a prefix of the other
        differences.append(
            {
                "id": rid,
                "position": pos,
                "lengths": {"a": len(ta), "b": len(tb)},
                "context": _show(decode, ta[max(0, pos - CONTEXT_TOKENS) : pos]),
                "a": _show(decode, ta[pos : pos + CONTINUATION_TOKENS]),
                "b": _show(decode, tb[pos : pos + CONTINUATION_TOKENS]),
                "errors": {"a": gen_a[rid].get("error"), "b": gen_b[rid].get("error")},
            }
        )
    total = len(ids)
    return {
        "comparable": True,
        "total": total,
        "identical": total - len(differences),
        "differences": differences,
    }


def verdict_line(verdict: dict[str, Any]) -> str:
    if verdict.get("placeholders"):
        return f"outputs not compared: {verdict['reason']}"
    if not verdict["comparable"]:
        return f"outputs not comparable: {verdict['reason']}"
    n, total = verdict["identical"], verdict["total"]
    if n == total:
        return f"identical tokens for {n}/{total} requests"
    return f"tokens differ for {total - n}/{total} requests ({n}/{total} identical)"
