"""One attention layer's position recipe, composed from the hooks: what today's models
put in each layer.

A 2025-26 model composes position per layer: a query/key transform (RoPE with this
layer's base and scaling, or none at all), a mask (causal, a window, a chunk), learned
sink logits, a query temperature that grows with position, a cap on the logits.
`Layer` holds one of each and posenc.attention runs it on every backend that can
express it; `posenc.recipes.layer_schemes` builds the list for a model from its
transformers config. `Masked` (posenc.score.masks) is the Layer with a mask only.

* **Sink logits** (gpt-oss, MiMo-V2-Flash, DeepSeek-V4): one learned logit s_h per
  head joins every softmax row and is dropped after it, so a row's weights sum to
  1 - p_sink. The explicit backend appends the column; sdpa appends a key of zeros
  whose additive mask is s_h; FlexAttention rescales its output by
  sigmoid(LSE - s_h), since
  sum_j e^{z_j} / (sum_j e^{z_j} + e^{s}) = 1 / (1 + e^{s - LSE}).
* **Query temperatures** multiply the queries (never the keys) by a factor that may
  depend on the query's position: DeepSeek's YaRN mscale^2 (a constant `query_scale`),
  Llama 4's NoPE layers and Mistral's llama_4_scaling_beta (`LogFloorTemperature`).
  A factor per query is a factor per row of logits, so a KV cache is unaffected.
* **Soft-capping** (Gemma 2): each logit z becomes cap * tanh(z / cap) before the
  mask and any bias; sdpa cannot express it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch
from torch import nn

from ._checks import as_positions, positive_float, positive_int
from .scheme import NoPE, Scheme


@dataclass(frozen=True)
class LogFloorTemperature:
    """Queries times 1 + beta * ln(1 + floor((p + offset) / step)): a temperature that
    steps up with the query's position p.

    Llama 4's NoPE layers: beta = attn_scale 0.1, step = floor_scale 8192, offset 1
    (1.069 at p = 8191, 1.283 at 131071). Mistral's `llama_4_scaling_beta` (Ministral 3,
    Mistral Small 4): beta 0.1, step = original_max_position_embeddings, offset 0. Both
    follow Scalable-Softmax (Nakanishi, 2025): a logit that grows like log n keeps the
    softmax's largest weight from fading as the context grows. Give it to a `Layer`
    (``temperature=``); called on positions, it returns the factors.

    Args:
        beta: the factor's growth per unit of ln(1 + floor(...)), >= 0.
        step: how many positions each step of the floor spans, > 0.
        offset: added to the position before the floor, >= 0.

    Raises:
        TypeError: an argument is not a number.
        ValueError: `beta` or `offset` is negative or not finite, or `step` is not
            a finite number > 0.

    Example:
        >>> import torch
        >>> from posenc.layer import LogFloorTemperature
        >>> llama4 = LogFloorTemperature(beta=0.1, step=8192, offset=1)
        >>> factors = llama4(torch.tensor([0, 8190, 8191, 131071]))
        >>> factors.dtype, factors.shape
        (torch.float32, torch.Size([4]))
        >>> [round(f, 3) for f in factors.tolist()]
        [1.0, 1.0, 1.069, 1.283]
    """

    beta: float
    step: float
    offset: float = 0.0

    def __post_init__(self):
        positive_float("beta", self.beta, minimum=0.0, inclusive=True)
        positive_float("step", self.step)
        positive_float("offset", self.offset, minimum=0.0, inclusive=True)

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """The factor for each position, float32, the shape of `positions`; 1 below
        position 0 (left padding)."""
        p = positions.to(torch.float32).clamp(min=0)
        return torch.log1p(torch.floor((p + self.offset) / self.step)) * self.beta + 1.0


def _position_tensor(positions, device) -> torch.Tensor:
    if isinstance(positions, range):
        return torch.arange(positions.start, positions.stop, device=device)
    return as_positions("positions", positions, integer=False).to(device)


class Layer(Scheme):
    """A layer's whole position recipe: `inner` (RoPE, NoPE, ALiBi...), a `mask`, sink
    logits, a query temperature, a cap on the logits.

    `inner` keeps its own hook (its query/key transform, its bias); the others make the
    layer a score scheme. Query scale and temperature act after the inner transform,
    on queries only, so a KV cache is unaffected. ``Layer(Rope(64, base=150000,
    rope_type="yarn", ...), sliding_window(128), sinks=64)`` is a gpt-oss window layer;
    ``Layer(temperature=LogFloorTemperature(0.1, 8192, 1))`` is Llama 4's NoPE layer.
    posenc.attention runs a Layer on every backend that can express it (soft-capping
    is not expressible with sdpa; sink logits not with compiled FlexAttention on the
    CPU).

    Args:
        inner: the scheme whose hook the layer keeps; None for NoPE.
        mask: a posenc.score.masks.Mask (sliding_window, chunked, bidirectional_window,
            prefix_lm, causal_with_blocks), or None.
        sinks: the number of heads, each given a learned sink logit (the parameter
            `self.sinks`, zeros at first, to be loaded from a checkpoint); None for
            none.
        query_scale: a constant factor on every query (DeepSeek's YaRN mscale^2).
        temperature: a factor of each query's position (a LogFloorTemperature).
        softcap: caps every logit z at +-softcap as softcap * tanh(z / softcap)
            (Gemma 2); None for no cap.

    Raises:
        TypeError: `inner` is not a Scheme, `mask` not a Mask, `temperature` not a
            LogFloorTemperature, or `sinks` not an integer.
        ValueError: `inner` is itself a Layer, a temperature is given for a scheme
            with several position axes, or `query_scale`, `softcap` or `sinks` is not
            positive.

    Example:
        >>> import torch, posenc
        >>> from posenc.score.masks import sliding_window
        >>> layer = posenc.Layer(posenc.Rope(head_dim=16), sliding_window(4), sinks=2)
        >>> layer.hook, layer.window, layer.sinks.shape
        ('score', 4, torch.Size([2]))
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 10, 16, generator=g)
        >>> out = posenc.attention(q, k, v, layer)
        >>> out.shape
        torch.Size([1, 2, 10, 16])
        >>> sdpa = posenc.attention(q, k, v, layer, backend="sdpa")
        >>> torch.testing.assert_close(sdpa, out)
    """

    name = "layer"

    def __init__(
        self,
        inner: Scheme | None = None,
        mask=None,
        *,
        sinks: int | None = None,
        query_scale: float = 1.0,
        temperature: LogFloorTemperature | None = None,
        softcap: float | None = None,
    ):
        super().__init__()
        from .score.masks import Mask

        if inner is not None and not isinstance(inner, Scheme):
            raise TypeError(
                f"inner must be a posenc Scheme or None, got {type(inner).__name__}"
            )
        if isinstance(inner, Layer):
            raise ValueError(
                f"inner must not be another composed layer ({inner.name}): "
                "give its parts to one Layer"
            )
        if mask is not None and not isinstance(mask, Mask):
            raise TypeError(
                "mask must be a posenc.score.masks.Mask (sliding_window, chunked, "
                "bidirectional_window, prefix_lm, causal_with_blocks) or None, "
                f"got {type(mask).__name__}"
            )
        if temperature is not None and not isinstance(temperature, LogFloorTemperature):
            raise TypeError(
                "temperature must be a posenc.layer.LogFloorTemperature or None, "
                f"got {type(temperature).__name__}"
            )
        self.inner = NoPE() if inner is None else inner
        if temperature is not None and self.inner.position_axes > 1:
            raise ValueError(
                "a query temperature reads 1-D positions; "
                "this inner scheme reads several axes"
            )
        self.mask = mask
        self.query_scale = positive_float("query_scale", query_scale)
        self.temperature = temperature
        self.softcap = None if softcap is None else positive_float("softcap", softcap)
        self.sinks = (
            None
            if sinks is None
            else nn.Parameter(torch.zeros(positive_int("sinks", sinks)))
        )
        inner = self.inner
        self.needs_weights, self.bias_is_constant, self.per_layer = (
            inner.needs_weights,
            inner.bias_is_constant,
            inner.per_layer,
        )
        self.position_axes = inner.position_axes
        self.sees_later_keys = mask is not None and mask.sees_later_keys
        self.mask_rows = None if mask is None else mask.rows
        self.window = None if mask is None else mask.window
        self.num_sinks = 0 if mask is None else mask.num_sinks
        changes_scores = mask is not None or sinks is not None or softcap is not None
        self.hook = "score" if changes_scores or inner.hook == "score" else inner.hook
        # learned logits belong to one layer
        self.per_layer = self.per_layer or sinks is not None

    @property
    def mask_mod(self):
        return None if self.mask is None else self.mask.mod

    def mask_key(self) -> Hashable | None:
        return None if self.mask is None else self.mask.key

    @property
    def score_mod(self):
        return self.inner.score_mod

    def embed(self, positions):
        return self.inner.embed(positions)

    def transform_qk(self, x, positions):
        x = self.inner.transform_qk(x, positions)
        if self.query_scale != 1.0:
            x = x * self.query_scale
        if self.temperature is not None:
            p = _position_tensor(positions, x.device)
            factor = self.temperature(
                p[:, None, :, None] if p.ndim == 2 else p[:, None]
            )
            x = (x * factor).to(x.dtype)
        return x

    def transform_k(self, x, positions):
        return self.inner.transform_k(x, positions)

    def query_score_mod(self, q, positions):
        return self.inner.query_score_mod(q, positions)

    def value_term(self, weights, positions):
        return self.inner.value_term(weights, positions)

    def extra_repr(self) -> str:
        parts = [] if self.mask is None else [f"mask={self.mask.key}"]
        if self.sinks is not None:
            parts.append(f"sinks={len(self.sinks)}")
        if self.query_scale != 1.0:
            parts.append(f"query_scale={self.query_scale:.6g}")
        if self.temperature is not None:
            parts.append(f"temperature={self.temperature}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g}")
        return ", ".join(parts)


def softcapped(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(scores / cap), Gemma 2's logit soft-capping; the scores unchanged
    where cap is None."""
    return scores if cap is None else torch.tanh(scores / cap) * cap


def softcap_score_mod(cap: float, then=None):
    """FlexAttention's score_mod for soft-capping, followed by `then` (the scheme's
    bias) where there is one."""

    def capped(score, b, h, q_idx, kv_idx):
        score = torch.tanh(score / cap) * cap
        return score if then is None else then(score, b, h, q_idx, kv_idx)

    return capped


def sink_factor(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """sigmoid(LSE - s_h), (batch, heads, q_len, 1): the share of each row's mass left
    to the keys beside a sink logit."""
    return torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))[..., None]


def with_sink_key(q, k, v, float_mask, sinks):
    """k and v with one key of zeros appended, whose additive mask is the head's sink
    logit: sdpa's softmax with a sink."""
    batch, heads, q_len = q.shape[0], q.shape[1], q.shape[2]
    zeros = lambda t: t.new_zeros(t.shape[0], t.shape[1], 1, t.shape[3])  # noqa: E731
    k, v = torch.cat((k, zeros(k)), dim=2), torch.cat((v, zeros(v)), dim=2)
    body = (
        torch.zeros((), dtype=q.dtype, device=q.device)
        if float_mask is None
        else float_mask
    )
    body = body.expand(batch, heads, q_len, k.shape[2] - 1)
    column = sinks.to(q.dtype).view(1, -1, 1, 1).expand(batch, heads, q_len, 1)
    return k, v, torch.cat((body, column), dim=-1)
