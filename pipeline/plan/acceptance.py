"""Whether a speculative configuration's acceptance was measured or assumed.

A speculative row's capacity rests on its per-position acceptance and proposal rate. They
count as measured only where `speculative.acceptance_from` names where they came from;
otherwise the row's acceptance is the schema's default or a number nobody traced to a
measurement, and the plan says "acceptance assumed" and ranks it after every row that
assumes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ASSUMED = "acceptance assumed"


def acceptance_assumed(config: Mapping[str, Any]) -> bool:
    """A resolved config (a job's resolved_config.yaml) with speculative decoding on and no
    `speculative.acceptance_from`."""
    node = config.get("speculative")
    if not isinstance(node, Mapping):
        return False
    method = str(node.get("method") or "none")
    return method != "none" and not str(node.get("acceptance_from") or "")


def acceptance_note(config: Mapping[str, Any]) -> str:
    """What a plan row says of its acceptance: "" without speculation."""
    node = config.get("speculative")
    if not isinstance(node, Mapping) or str(node.get("method") or "none") == "none":
        return ""
    source = str(node.get("acceptance_from") or "")
    if source:
        return f"acceptance from {source}"
    return (
        f"{ASSUMED} (speculative.acceptance={node.get('acceptance')}, proposal_rate="
        f"{node.get('proposal_rate')}: give speculative.acceptance_from)"
    )
