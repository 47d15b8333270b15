"""A key's default is written once, in its schema: the stage an option builds takes every
key of the option without a default of its own."""

from __future__ import annotations

import dataclasses
import inspect

from hydra.utils import get_object

from pipeline.schema import SCHEMAS


def repeated_defaults(conf: type) -> list[str]:
    """The option's keys that its `_target_` gives a default too."""
    keys = {f.name for f in dataclasses.fields(conf)} - {"_target_"}
    target = get_object(conf._target_)
    return [
        f"{conf._target_}({p.name}={p.default!r})"
        for p in inspect.signature(target).parameters.values()
        if p.name in keys and p.default is not inspect.Parameter.empty
    ]


def test_no_stage_repeats_a_default_its_schema_gives():
    built = [conf for conf in SCHEMAS.values() if "_target_" in conf.__dataclass_fields__]
    assert len(built) >= 20  # every option that builds a stage is looked at
    repeated = [d for conf in built for d in repeated_defaults(conf)]
    assert not repeated, f"defaults also given in pipeline/schema/: {repeated}"


def _with_a_default(add_bos: bool = True) -> None:
    """A stage that repeats its schema's default."""


@dataclasses.dataclass
class _RepeatingConf:
    _target_: str = f"{__name__}._with_a_default"
    add_bos: bool = True


def test_a_repeated_default_is_found():
    assert repeated_defaults(_RepeatingConf) == [f"{__name__}._with_a_default(add_bos=True)"]
