"""A model folder: its JSON files, special token ids and which shard holds each tensor.
Only safetensors are read, so nothing from the folder is executed or unpickled."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.loading.checkpoint.config import CheckpointSpec, read_spec
from stages.loading.checkpoint.reading import open_safetensors

INDEX_FILE = "model.safetensors.index.json"
# Formats that are unpickled (or need their framework's own loader) when read.
UNSAFE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pdparams", "*.pkl")


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    """A JSON object file; a missing or malformed file is a one-line error."""
    if not path.is_file():
        if required:
            raise ValueError(f"{path} is missing")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def model_folder(path: str | Path, key: str = "model.path") -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{key}={path}: no such folder")
    return folder


def read_folder_spec(path: str | Path) -> CheckpointSpec:
    """The checked config.json of a model folder whose weight files can be read without
    blocking (a FIFO or a device named *.safetensors would block or never end)."""
    folder = model_folder(path)
    for weights in sorted(folder.glob("*.safetensors")):
        if not weights.is_file():
            raise ValueError(f"{weights} is not a regular file: model.path must hold real files")
    return read_spec(read_json(folder / "config.json"))


def _token_ids(value: Any, key: str = "token id") -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        # A string such as "2" would otherwise be dropped, silently disabling the token.
        raise ValueError(f"{key}={value!r} must be a token id (an integer) or a list of them")
    return values


@dataclass(frozen=True)
class SpecialIds:
    bos_id: int | None
    eos_ids: frozenset[int]
    pad_id: int | None


def read_special_ids(folder: Path) -> SpecialIds:
    """BOS, EOS and PAD ids from config.json and generation_config.json (int or list each);
    EOS is the union of both, since generation configs often add end-of-turn ids."""
    config = read_json(folder / "config.json", required=False)
    generation = read_json(folder / "generation_config.json", required=False)

    def ids(source: dict[str, Any], name: str, key: str) -> list[int]:
        return _token_ids(source.get(key), f"{name} {key}")

    gen = "generation_config.json"
    eos = ids(config, "config.json", "eos_token_id") + ids(generation, gen, "eos_token_id")
    bos = ids(generation, gen, "bos_token_id") or ids(config, "config.json", "bos_token_id")
    pad = ids(config, "config.json", "pad_token_id") or ids(generation, gen, "pad_token_id")
    return SpecialIds(bos[0] if bos else None, frozenset(eos), pad[0] if pad else None)


def weight_files(folder: Path) -> dict[str, Path]:
    """Each stored tensor's shard: from model.safetensors.index.json, else every
    *.safetensors file in the folder."""
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path} has no weight_map")
        files: dict[str, Path] = {}
        for key, name in weight_map.items():
            # A shard is named inside the folder; an index pointing elsewhere is refused.
            if not isinstance(name, str) or Path(name).name != name:
                raise ValueError(
                    f"{index_path}: shard {name!r} of {key} is not a file in the folder"
                )
            path = folder / name
            if not path.is_file():
                raise ValueError(f"{path} is missing (named by {INDEX_FILE} for {key})")
            files[key] = path
        return files
    shards = sorted(folder.glob("*.safetensors"))
    for path in shards:  # a FIFO or a device would block the header's read for ever
        if not path.is_file():
            raise ValueError(f"{path} is not a regular file: a model folder must hold real files")
    if not shards:
        unsafe = sorted(p.name for pattern in UNSAFE_WEIGHTS for p in folder.glob(pattern))
        if unsafe:
            raise ValueError(
                f"{folder} has weights only as {', '.join(unsafe[:3])}: these formats are "
                "unpickled when read, which can run code, so only *.safetensors are loaded "
                "(convert them to safetensors first)"
            )
        raise ValueError(f"{folder} has no *.safetensors weights")
    files = {}
    for path in shards:
        with open_safetensors(path) as handle:
            for key in handle.keys():
                files.setdefault(key, path)
    return files
