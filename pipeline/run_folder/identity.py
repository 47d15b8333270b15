"""What a run folder's lines were made with: its resolved config and a digest of the model's
and tokenizer's files, written once when the run starts (identity.json). A resume compares
the folder's config, as it finds it, and the files, as they are now, against this record, so
an edited `.hydra/config.yaml` or replaced weights cannot mix two models' outputs in one
folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.checks import ConfigError
from pipeline.run_folder import artefacts
from pipeline.run_folder.reader import RESOLVED_CONFIG, RunFileError, read_mapping

IDENTITY = "identity.json"
# Keys that change how fast a run goes, never which tokens it makes.
TOKEN_NEUTRAL = frozenset({"num_threads", "warmup"})
# Config sections whose `path` names files that decide tokens (weights, tokenizer).
FILE_SECTIONS = ("model", "tokenizer")
SAMPLE_BYTES = 1 << 20  # a file's digest covers its size, first and last MiB


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def token_config(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """The resolved config as dotted keys, less the token-neutral ones and `resume`."""
    plain = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    return {
        key: value
        for key, value in _flat(plain).items()
        if key.split(".")[0] not in TOKEN_NEUTRAL | {"resume", "hydra"}
    }


def file_digest(path: Path) -> str:
    """Size and a hash of the file's ends: weights are gigabytes, and a different file
    differs in its header (shapes, offsets) or its size."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            digest.update(f.read())
    return f"{size}:{digest.hexdigest()[:16]}"


def file_digests(cfg: DictConfig) -> dict[str, str]:
    """Each regular file a model or tokenizer `path` names (or holds, for a folder)."""
    out: dict[str, str] = {}
    for section in FILE_SECTIONS:
        value = OmegaConf.select(cfg, f"{section}.path", default=None)
        if not isinstance(value, str) or not value:
            continue
        root = Path(value).expanduser()
        files = sorted(root.iterdir()) if root.is_dir() else [root]
        for file in files:
            if file.is_file():  # never a FIFO: reading one would block
                out[f"{section}.path:{file.name}"] = file_digest(file)
    return out


def identity(cfg: DictConfig) -> dict[str, Any]:
    return {"config": token_config(cfg), "files": file_digests(cfg)}


def write_identity(cfg: DictConfig, out_dir: Path) -> None:
    text = json.dumps(identity(cfg), indent=1, sort_keys=True, default=str) + "\n"
    artefacts.replace_text(out_dir / IDENTITY, text)


def _recorded(folder: Path) -> dict[str, Any] | None:
    """The folder's record: identity.json, or for a folder from before it, the resolved
    config the run wrote at its start."""
    path = folder / IDENTITY
    if path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise RunFileError(f"{path} is not valid JSON: serve the run again") from err
        if not (isinstance(record, dict) and isinstance(record.get("config"), dict)):
            raise RunFileError(f"{path} is not an identity record: serve the run again")
        return record
    if (folder / RESOLVED_CONFIG).is_file():
        return {"config": token_config(read_mapping(folder / RESOLVED_CONFIG))}
    return None


def check_identity(cfg: DictConfig, folder: Path, finished: int) -> None:
    """ConfigError if `cfg` (the folder's config as resume will serve it) or the files it
    names differ from what the folder's `finished` lines were made with."""
    record = _recorded(folder)
    if record is None or not finished:
        return
    try:
        now = json.loads(json.dumps(identity(cfg), default=str))  # as the record was written
    except OmegaConfBaseException as err:
        raise ConfigError(f"resume: {folder}'s config does not resolve ({err.msg})") from err
    was = record["config"]
    for key in sorted(was.keys() | now["config"].keys()):
        if key in TOKEN_NEUTRAL:
            continue
        old, new = was.get(key, "(absent)"), now["config"].get(key, "(absent)")
        if old != new:
            raise ConfigError(
                f"resume: {key} is {new!r} in {folder}'s config, but its {finished} finished "
                f"lines were made with {old!r}: restore the folder's config, or serve the "
                "new config into a new folder"
            )
    for key, old in (record.get("files") or {}).items():
        new = now["files"].get(key, "(missing)")
        if old != new:
            raise ConfigError(
                f"resume: {key} is not the file the folder's {finished} finished lines were "
                "made with (its size or contents changed): restore it, or serve into a new folder"
            )
