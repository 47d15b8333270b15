"""A decoder-only transformer of the Llama / ERNIE-4.5 family, written with Paddle ops.

RMSNorm, rotary positions (rotate-half), grouped-query attention and a SwiGLU MLP. The model
computes projections and the MLP on all of a step's rows; attention goes to the attention
stage, which owns the KV cache. Built-in weights are drawn from a seed, so no download.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F

from stages.metadata import ForwardMeta


@dataclass(frozen=True)
class ModelDims:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int

    @property
    def num_parameters(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp + 2 * h) + 2 * self.vocab_size * h + h


@dataclass
class LayerWeights:
    attn_norm: paddle.Tensor
    qkv: paddle.Tensor  # [hidden, (heads + 2 * kv_heads) * head_dim]
    out: paddle.Tensor  # [heads * head_dim, hidden]
    mlp_norm: paddle.Tensor
    gate_up: paddle.Tensor  # [hidden, 2 * intermediate]
    down: paddle.Tensor  # [intermediate, hidden]


class TransformerLM:
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        num_layers: int,
        num_heads: int,
        num_kv_heads: int,
        intermediate_size: int,
        max_position: int,
        head_dim: int = 0,
        rope_theta: float = 10000.0,
        rms_eps: float = 1e-6,
        seed: int = 0,
        dtype: str = "float32",
    ) -> None:
        head_dim = head_dim or hidden_size // num_heads
        if num_heads % num_kv_heads:
            raise ValueError("model.num_heads must be a multiple of model.num_kv_heads")
        self.dims = ModelDims(
            vocab_size,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
        )
        self.rms_eps = rms_eps
        self.dtype = dtype
        self._init_weights(np.random.default_rng(seed))
        self._init_rope(max_position, rope_theta)

    def _init_weights(self, rng: np.random.Generator) -> None:
        d = self.dims
        qkv_width = (d.num_heads + 2 * d.num_kv_heads) * d.head_dim

        def normal(rows: int, cols: int, std: float) -> paddle.Tensor:
            return paddle.to_tensor(rng.normal(0.0, std, (rows, cols)).astype(self.dtype))

        def ones(n: int) -> paddle.Tensor:
            return paddle.ones([n], dtype=self.dtype)

        # Unit-variance embeddings and 1/sqrt(fan_in) projections keep logits well spread,
        # so greedy choices are far from ties and comparisons across layouts are stable.
        self.embed = normal(d.vocab_size, d.hidden_size, 1.0)
        self.layers = [
            LayerWeights(
                attn_norm=ones(d.hidden_size),
                qkv=normal(d.hidden_size, qkv_width, d.hidden_size**-0.5),
                out=normal(
                    d.num_heads * d.head_dim, d.hidden_size, (d.num_heads * d.head_dim) ** -0.5
                ),
                mlp_norm=ones(d.hidden_size),
                gate_up=normal(d.hidden_size, 2 * d.intermediate_size, d.hidden_size**-0.5),
                down=normal(d.intermediate_size, d.hidden_size, d.intermediate_size**-0.5),
            )
            for _ in range(d.num_layers)
        ]
        self.final_norm = ones(d.hidden_size)
        self.lm_head = normal(d.hidden_size, d.vocab_size, d.hidden_size**-0.5)

    def _init_rope(self, max_position: int, theta: float) -> None:
        half = self.dims.head_dim // 2
        inv_freq = 1.0 / theta ** (np.arange(half, dtype=np.float64) / half)
        angles = np.outer(np.arange(max_position, dtype=np.float64), inv_freq)
        angles = np.concatenate([angles, angles], axis=-1)
        self.cos = paddle.to_tensor(np.cos(angles).astype(self.dtype))
        self.sin = paddle.to_tensor(np.sin(angles).astype(self.dtype))

    def _rms_norm(self, x: paddle.Tensor, weight: paddle.Tensor) -> paddle.Tensor:
        variance = x.pow(2).mean(axis=-1, keepdim=True)
        return x * paddle.rsqrt(variance + self.rms_eps) * weight

    @staticmethod
    def _rotate(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        half = x.shape[-1] // 2
        rotated = paddle.concat([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    @paddle.no_grad()
    def forward(self, meta: ForwardMeta, attention) -> paddle.Tensor:
        """Logits [rows, vocab] for meta.logits_rows: each chunk's last token, each decode."""
        d = self.dims
        n = meta.input_ids.shape[0]
        h = paddle.gather(self.embed, meta.input_ids)
        cos = paddle.gather(self.cos, meta.positions).unsqueeze(1)  # [n, 1, head_dim]
        sin = paddle.gather(self.sin, meta.positions).unsqueeze(1)
        q_width, kv_width = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
        for index, layer in enumerate(self.layers):
            qkv = paddle.matmul(self._rms_norm(h, layer.attn_norm), layer.qkv)
            q, k, v = paddle.split(qkv, [q_width, kv_width, kv_width], axis=-1)
            q = self._rotate(q.reshape([n, d.num_heads, d.head_dim]), cos, sin)
            k = self._rotate(k.reshape([n, d.num_kv_heads, d.head_dim]), cos, sin)
            v = v.reshape([n, d.num_kv_heads, d.head_dim])
            h = h + paddle.matmul(attention.forward(index, q, k, v, meta), layer.out)
            gate, up = paddle.chunk(
                paddle.matmul(self._rms_norm(h, layer.mlp_norm), layer.gate_up), 2, axis=-1
            )
            h = h + paddle.matmul(F.silu(gate) * up, layer.down)
        last = paddle.gather(h, meta.logits_rows)
        return paddle.matmul(self._rms_norm(last, self.final_norm), self.lm_head)
