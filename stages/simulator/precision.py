"""Numeric precision of a simulated deployment: how weights, activations and the KV cache
are stored, which sets the bytes a step reads and the GEMM rate it runs at.

`quantization` names the weights' (and for FP8 the activations') format as FastDeploy and
vLLM name it: `none` keeps the model's dtype (bf16), `fp8` stores weights and activations
in FP8 and runs the GEMMs at the device's FP8 rate, `wint8` / `wint4` store weights as
int8 / int4 and dequantise them to bf16 inside the GEMM (the bf16 rate, the smaller
read). The embedding table and the lm head stay in the model's dtype, as FP8 and
weight-only checkpoints (ModelOpt, FastDeploy) leave them. `kv_cache_dtype` is `auto`
(the model's dtype) or `fp8` (one byte a value).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stages.model.spec import ModelSpec


class Quantization(enum.StrEnum):
    """Members are named by their values: OmegaConf matches a config value by name."""

    none = "none"  # the model's dtype (bf16)
    fp8 = "fp8"  # FP8 weights and activations, FP8 GEMMs
    wint8 = "wint8"  # int8 weights, bf16 GEMMs after dequantising
    wint4 = "wint4"  # int4 weights, bf16 GEMMs after dequantising


class KvCacheDtype(enum.StrEnum):
    auto = "auto"  # the model's dtype
    fp8 = "fp8"  # one byte a key or value


_WEIGHT_BYTES = {Quantization.fp8: 1.0, Quantization.wint8: 1.0, Quantization.wint4: 0.5}


@dataclass(frozen=True)
class Precision:
    quantization: Quantization
    kv_cache_dtype: KvCacheDtype

    def __post_init__(self) -> None:
        # Plain strings from a config or a caller become the enums (a bad one: ValueError).
        object.__setattr__(self, "quantization", Quantization(self.quantization))
        object.__setattr__(self, "kv_cache_dtype", KvCacheDtype(self.kv_cache_dtype))

    @property
    def fp8_gemm(self) -> bool:
        """Whether the projections and MLPs run at the device's FP8 rate."""
        return self.quantization is Quantization.fp8

    def weight_bytes(self, dtype_bytes: float) -> float:
        """Bytes of one quantised weight (projections, MLPs, experts)."""
        return _WEIGHT_BYTES.get(self.quantization, dtype_bytes)

    def kv_bytes(self, dtype_bytes: float) -> float:
        """Bytes of one cached key or value."""
        return 1.0 if self.kv_cache_dtype is KvCacheDtype.fp8 else dtype_bytes

    def model_weight_bytes(self, spec: ModelSpec, tp: int = 1) -> float:
        """Every weight of `spec` per device at `tp`: the layers quantised, the embedding
        table and lm head in the model's dtype."""
        tables = (1 if spec.tied_embeddings else 2) * spec.lm_head_params(tp)
        layers = spec.num_parameters(tp) - tables
        return layers * self.weight_bytes(spec.dtype_bytes) + tables * spec.dtype_bytes

    @property
    def label(self) -> str:
        """`none/auto`, `fp8/fp8`: weights, then the KV cache."""
        return f"{self.quantization.value}/{self.kv_cache_dtype.value}"


BF16 = Precision(Quantization.none, KvCacheDtype.auto)  # the model's own dtype throughout
