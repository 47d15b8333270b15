"""A GGUF file's header: its metadata and its tensors' names, shapes, types and places.

Read with bounds checks before anything is allocated: every count and length in the header
is compared with the bytes left in the file, so a truncated or corrupt file (or one claiming
a billion tensors) is a one-line ValueError, never a huge allocation or a read past the end.
The layout is llama.cpp's GGUF v2/v3 (little-endian): magic "GGUF", version, tensor count,
metadata count, the metadata (key, type, value), the tensor infos (name, dims, type, offset),
then the data, aligned to `general.alignment` (32 by default). The type codes and block sizes
are the `gguf` package's own (llama.cpp's constants).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from stages.arithmetic import ceil_div

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS

# Fixed-size scalar values by type: struct format, bytes.
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_KNOWN_TYPES = frozenset(t.value for t in GGMLQuantizationType)
_NUMPY_SCALARS = {kind: np.dtype(fmt) for kind, fmt in _SCALARS.items()}
_MIN_STRING = 8  # a string is a uint64 length, then its bytes
_MIN_KV = _MIN_STRING + 4 + 1  # key, value type, the smallest value
_MIN_TENSOR_INFO = _MIN_STRING + 4 + 4 + 8  # name, n_dims, type, offset (dims may be none)

# Block size and bytes per block of each type, by its code (a type gguf-py does not know
# is looked up by its number).
_QUANT_SIZES: dict[int, tuple[int, int]] = {int(k): v for k, v in GGML_QUANT_SIZES.items()}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first): GGUF's dims reversed
    kind: GGMLQuantizationType | int  # an int where the gguf package does not know the code
    offset: int  # bytes from the start of the file

    @property
    def type_name(self) -> str:
        return self.kind.name if isinstance(self.kind, GGMLQuantizationType) else str(self.kind)

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def num_bytes(self) -> int:
        block, size = _QUANT_SIZES[self.kind]
        return self.num_elements // block * size


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # arrays of numbers as numpy arrays, of strings as lists
    tensors: dict[str, TensorInfo]
    data_start: int
    file_size: int


class _Cursor:
    """Reads little-endian values from a buffer, refusing to pass its end."""

    def __init__(self, buffer: Any, path: Path) -> None:
        self.buffer, self.path, self.pos, self.size = buffer, path, 0, len(buffer)

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what} (at byte {self.pos} of {self.size})")

    def need(self, count: int, what: str) -> None:
        if count < 0 or self.pos + count > self.size:
            raise self.fail(f"the file ends inside {what}: it is truncated or corrupt")

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += size
        return value

    def count(self, item_bytes: int, what: str) -> int:
        """A uint64 count of items of at least item_bytes each, checked against the bytes left."""
        value = self.scalar("<Q", what)
        if value * item_bytes > self.size - self.pos:
            raise self.fail(
                f"{what} is {value:,}, more than the {self.size - self.pos:,} bytes left can hold"
            )
        return value

    def string(self, what: str) -> str:
        length = self.count(1, f"the length of {what}")
        raw = bytes(self.buffer[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(f"{what} is not UTF-8") from err


def _value_type(cursor: _Cursor, code: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise cursor.fail(f"metadata {key!r} has unknown value type {code}") from None


def _value(cursor: _Cursor, kind: GGUFValueType, key: str) -> Any:
    if kind in _SCALARS:
        return cursor.scalar(_SCALARS[kind], f"metadata {key!r}")
    if kind == GGUFValueType.STRING:
        return cursor.string(f"metadata {key!r}")
    item = _value_type(cursor, cursor.scalar("<I", f"metadata {key!r}"), key)
    if item == GGUFValueType.ARRAY:
        raise cursor.fail(f"metadata {key!r} is an array of arrays, which is not read")
    if item == GGUFValueType.STRING:
        length = cursor.count(_MIN_STRING, f"the length of array {key!r}")
        return [cursor.string(f"an item of {key!r}") for _ in range(length)]
    dtype = _NUMPY_SCALARS[item]
    length = cursor.count(dtype.itemsize, f"the length of array {key!r}")
    values = np.frombuffer(cursor.buffer, dtype=dtype, count=length, offset=cursor.pos).copy()
    cursor.pos += length * dtype.itemsize
    return values


def _tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string("a tensor name")
    n_dims = cursor.scalar("<I", f"tensor {name!r}'s dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cursor.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} are read)")
    dims = tuple(cursor.scalar("<Q", f"tensor {name!r}'s dims") for _ in range(n_dims))
    kind = cursor.scalar("<I", f"tensor {name!r}'s type")
    offset = cursor.scalar("<Q", f"tensor {name!r}'s offset")
    return name, tuple(reversed(dims)), kind, offset


def _check_tensor(info: TensorInfo, file_size: int, path: Path) -> None:
    """The tensor's type is known, its shape fills whole blocks and its bytes lie in the file."""
    if info.kind not in GGML_QUANT_SIZES:
        return  # reported where it is loaded (inspect lists it); the size is unknown
    block, _ = _QUANT_SIZES[info.kind]
    if any(d < 1 for d in info.shape) or info.shape[-1] % block:
        raise ValueError(
            f"{path}: tensor {info.name!r} has shape {list(info.shape)}, whose rows are not "
            f"whole {info.type_name} blocks of {block}: the header is corrupt"
        )
    end = info.offset + info.num_bytes
    if end > file_size:
        raise ValueError(
            f"{path}: tensor {info.name!r} ({info.type_name} {list(info.shape)}, "
            f"{info.num_bytes:,} bytes) ends at byte {end:,}, past the file's {file_size:,}: "
            "the file is truncated or its header disagrees with the data"
        )


def _check_overlaps(tensors: list[TensorInfo], path: Path) -> None:
    """Each tensor's bytes end before the next one's begin: a shape that claims more data
    than its place in the file holds disagrees with the header's offsets."""
    known = sorted((t for t in tensors if t.kind in GGML_QUANT_SIZES), key=lambda t: t.offset)
    for this, following in zip(known, known[1:], strict=False):
        if this.offset + this.num_bytes > following.offset:
            raise ValueError(
                f"{path}: tensor {this.name!r} ({this.type_name} {list(this.shape)}) needs "
                f"{this.num_bytes:,} bytes but {following.name!r} starts "
                f"{following.offset - this.offset:,} bytes after it: its size disagrees with "
                "its shape"
            )


def _parse(cursor: _Cursor, path: Path, file_size: int) -> GgufHeader:
    magic = bytes(cursor.buffer[:4]) if cursor.size >= 4 else bytes(cursor.buffer)
    if magic != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    cursor.pos = 4
    version = cursor.scalar("<I", "the version")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{path}: GGUF version {version} is not read (versions 2 and 3 are)")
    n_tensors = cursor.scalar("<Q", "the tensor count")
    n_kv = cursor.count(_MIN_KV, "the metadata count")
    if n_tensors * _MIN_TENSOR_INFO > cursor.size - cursor.pos:
        raise cursor.fail(f"the tensor count is {n_tensors:,}, more than the file can hold")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cursor.string("a metadata key")
        kind = _value_type(cursor, cursor.scalar("<I", f"metadata {key!r}'s type"), key)
        metadata[key] = _value(cursor, kind, key)
    infos = [_tensor_info(cursor) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"{path}: general.alignment={alignment!r} is not a power of two")
    data_start = ceil_div(cursor.pos, alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, code, offset in infos:
        if name in tensors:
            raise ValueError(f"{path}: tensor {name!r} is listed twice")
        tensor_kind = GGMLQuantizationType(code) if code in _KNOWN_TYPES else code
        info = TensorInfo(name, shape, tensor_kind, data_start + offset)
        _check_tensor(info, file_size, path)
        tensors[name] = info
    _check_overlaps(list(tensors.values()), path)
    return GgufHeader(path, version, metadata, tensors, data_start, file_size)


def read_gguf_header(path: str | Path, key: str = "model.path") -> GgufHeader:
    """The file's metadata and tensor infos, checked; reads no tensor data."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"{key}={path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path} is empty, not a GGUF file")
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
        buffer = memoryview(view)
        try:
            return _parse(_Cursor(buffer, path), path, size)
        finally:
            buffer.release()


def is_gguf(path: str | Path) -> bool:
    """Whether the path is a file starting with the GGUF magic."""
    path = Path(path).expanduser()
    if not path.is_file():
        return False
    try:
        with path.open("rb") as file:
            return file.read(4) == MAGIC
    except OSError:  # a file that cannot be read (/proc/self/mem) is no GGUF file
        return False
