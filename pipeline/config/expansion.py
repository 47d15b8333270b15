"""Bounds on how large a config or a result may grow: a value that refers to others twice
over (`b: ${a}${a}`, `c: ${b}${b}`, ...) doubles at each level, and forty levels are a
terabyte, built when the config is resolved or a result written. The size is estimated on
the references, without building anything."""

from __future__ import annotations

import math
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError

MAX_VALUE_CHARS = 1_000_000  # a resolved config value; the longest real ones are paths
MAX_RECORD_VALUES = 1_000_000  # values in one metrics record, shared references counted each time
MAX_RECORD_STRING = 10_000  # characters of one string in a metrics record

# A plain reference to another key; a resolver's (`${oc.env:X}`) is left as it is written.
_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.\-\[\]]*)\}")


def check_expansion(cfg: DictConfig) -> None:
    """ConfigError naming the first key whose resolved value would exceed MAX_VALUE_CHARS."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    sizes: dict[str, float] = {}

    def lookup(path: str) -> Any:
        node: Any = plain
        for part in path.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return None
        return node

    def size(key: str, value: Any) -> float:
        if key in sizes:
            return sizes[key]
        sizes[key] = math.inf  # a reference back to itself: resolving it fails anyway
        if isinstance(value, dict):
            total = sum(size(f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            total = sum(size(f"{key}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, str):
            refs = _REFERENCE.findall(value)
            literal = len(_REFERENCE.sub("", value))
            total = literal + sum(size(ref, lookup(ref)) for ref in refs)
        else:
            total = len(str(value))
        sizes[key] = total
        return total

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in node.items()]
        else:
            items = [(f"{prefix}[{i}]", v) for i, v in enumerate(node)]
        for key, value in items:
            if isinstance(value, dict | list):
                walk(key, value)
            elif size(key, value) > MAX_VALUE_CHARS:
                raise ConfigError(
                    f"{key} would expand to more than {MAX_VALUE_CHARS} characters through "
                    "the values it refers to: give it a value without repeated references"
                )

    walk("", plain)


def bounded_record(record: dict[str, Any]) -> dict[str, Any]:
    """`record` as it may be written: a field too large to write (a value shared over and
    over, a string of megabytes) is replaced by a note saying so, so that a result is never
    lost to one field of it."""
    budget = [MAX_RECORD_VALUES]

    def fits(value: Any) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if isinstance(value, str):
            return len(value) <= MAX_RECORD_STRING
        if isinstance(value, dict):
            return all(fits(k) and fits(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return all(fits(v) for v in value)
        return True

    out: dict[str, Any] = {}
    for key, value in record.items():
        before = budget[0]
        if fits(value):
            out[key] = value
        else:
            out[key] = "(not recorded: larger than a metrics record may hold)"
            budget[0] = before  # what a refused field counted is not spent
    return out
