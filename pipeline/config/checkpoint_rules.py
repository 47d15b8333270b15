"""What a row's checkpoint lets an engine run: its own MTP head for speculative.method=mtp,
and FP8 weights without a BF16 load the cards cannot hold. A plan rules such a row out
before any search, with the reason; the scripts serve a published FP8 checkpoint where
quantizing on load would not fit.

vLLM and SGLang quantize `--quantization fp8` on load from the BF16 weights, which are read
in first (vLLM docs/features/quantization/fp8.md, "online dynamic quantization"; SGLang
docs/advanced_features/quantization.md); a published FP8 checkpoint is read as FP8."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from pipeline.config.checks import describe_model
from stages.simulator.hardware import GIB
from stages.simulator.precision import BF16


@dataclass(frozen=True)
class Fp8Load:
    """Online FP8 on a row's cards: the BF16 shard each card reads first against its memory."""

    bf16_per_card: float  # bytes
    card: float  # bytes
    published: str  # the model's published FP8 checkpoint ("" = none)

    @property
    def fits(self) -> bool:
        return self.bf16_per_card <= self.card

    def why(self, model: str, tp: int) -> str:
        return (
            f"online FP8 reads {model}'s BF16 weights first: {self.bf16_per_card / 2**30:,.0f} GiB "
            f"a card at tp={tp} into {self.card / 2**30:,.0f} GiB cards"
        )


def fp8_load(config: Mapping[str, Any]) -> Fp8Load | None:
    """The BF16 load of a row quantized to FP8 on load (quantization=fp8), None for any
    other precision or without a device."""
    hardware = config.get("hardware")
    if str(config.get("quantization", "none")) != "fp8" or not isinstance(hardware, Mapping):
        return None
    spec, _ = describe_model(OmegaConf.create(dict(config)))
    tp = int(config.get("tp", 1))
    card = float(hardware.get("hbm_capacity_gib", 0)) * GIB
    published = str(config["model"].get("fp8_checkpoint") or "")
    return Fp8Load(BF16.model_weight_bytes(spec, tp), card, published)


def checkpoint_refusal(config: Mapping[str, Any]) -> str | None:
    """Why the row's checkpoint cannot serve it, or None: speculative.method=mtp on a
    checkpoint without MTP layers; online FP8 whose BF16 load does not fit and no FP8
    checkpoint published to serve instead."""
    model = config["model"]
    name = str(model.get("name") or "the model")
    method = str((config.get("speculative") or {}).get("method", "none"))
    if method == "mtp" and int(model.get("mtp_layers", -1)) == 0:
        return (
            f"speculative.method=mtp: {name} has no MTP layers (no num_nextn_predict_layers "
            "in its config.json); use speculative.method=eagle, draft or ngram"
        )
    load = fp8_load(config)
    if load is not None and not load.fits and not load.published:
        return (
            f"quantization=fp8: {load.why(name, int(config.get('tp', 1)))}, and no FP8 "
            "checkpoint is published for it (model.fp8_checkpoint); raise tp or keep bf16"
        )
    return None


def served_checkpoint(config: Mapping[str, Any], model: str) -> tuple[str, str]:
    """(The checkpoint the scripts load, the words that say why) for a row: the published
    FP8 checkpoint where online FP8 would not fit while loading, else `model` itself."""
    load = fp8_load(config)
    if load is None or load.fits or not load.published:
        return model, ""
    why = load.why(str(config["model"].get("name") or model), int(config.get("tp", 1)))
    return load.published, f"serves the published FP8 checkpoint {load.published} ({why})"
