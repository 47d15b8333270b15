"""Reading a YAML file the user hands over (a device profile, a run folder's config) within
bounds: the file's size, and how far its aliases may expand.

YAML aliases are shared references: a ten-line file can stand for a billion values, which
the parse keeps small but every later walk over them (a JSON dump, a config merge)
materialises. The expansion is counted on the parsed node graph, an alias counted as often
as it is referred to, before any Python value is built.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

MAX_YAML_BYTES = 4 * 1024 * 1024  # the largest profile or run config is a few kilobytes
MAX_YAML_VALUES = 200_000  # values after aliases are expanded


class YamlFileError(ValueError):
    """A YAML file that cannot be read as asked; the message names the file."""


def read_yaml(path: str | Path, what: str, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """The file's value; YamlFileError (naming `what`, e.g. `hardware.path=FILE`) for a file
    that is missing, not regular, too large, not YAML or expanding beyond MAX_YAML_VALUES."""
    file = Path(path).expanduser()
    if not file.is_file():  # also refuses a FIFO, which would block the read for ever
        raise YamlFileError(f"{what}: no such file (or not a regular file)")
    size = file.stat().st_size
    if size > max_bytes:
        raise YamlFileError(
            f"{what} is {size / 2**20:.1f} MiB, more than the {max_bytes / 2**20:.0f} MiB a "
            "YAML file here may hold: give the right file"
        )
    try:
        text = file.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        problem = " ".join(str(getattr(err, "strerror", None) or err).split())
        raise YamlFileError(f"{what} is not valid YAML: {problem}") from err
    if node is None:
        return None
    expanded = _expanded_size(node, {})
    if expanded > MAX_YAML_VALUES:
        raise YamlFileError(
            f"{what}: its aliases expand to more than {MAX_YAML_VALUES} values: write the "
            "values out, without anchors that refer to each other"
        )
    try:
        return yaml.SafeLoader(text).construct_document(node)
    except yaml.YAMLError as err:  # e.g. an unhashable key
        raise YamlFileError(f"{what} is not valid YAML: {' '.join(str(err).split())}") from err


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Values under `node` with every alias expanded; capped just above the limit. `sizes`
    memoises per node, so a chain of doubling aliases costs its length, not its size."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = MAX_YAML_VALUES + 1  # a node met again while inside itself: a cycle
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            total += _expanded_size(child, sizes)
            if total > MAX_YAML_VALUES:
                break
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            total += _expanded_size(key, sizes) + _expanded_size(value, sizes)
            if total > MAX_YAML_VALUES:
                break
    sizes[id(node)] = total = min(total, MAX_YAML_VALUES + 1)
    return total


def finite_number(value: Any, key: str) -> float:
    """`value` as a float, or ValueError naming `key`: booleans, strings, NaN and infinities
    are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}={value!r} is not a number: write a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{key}={value!r} is not a finite number: write a finite number")
    return number


def boolean(value: Any, key: str) -> bool:
    """`value` if it is a YAML boolean; `"no"` (a string) and 0 are not."""
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r} is not a boolean: write true or false")
    return value
