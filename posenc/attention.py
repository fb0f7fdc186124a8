"""One attention entry point for every scheme, with interchangeable backends.

* ``"explicit"`` materialises the (batch, heads, q_len, k_len) scores and can return the weights;
* ``"sdpa"`` calls torch.nn.functional.scaled_dot_product_attention with the bias and mask
  folded into one additive float mask (or ``is_causal`` when there is neither);
* ``"flex"`` calls FlexAttention with the scheme's score_mod and a block mask. It is run
  uncompiled here (correct, but it materialises the scores); compile it for speed.

All backends return zeros, not NaN, for a query whose every key is masked.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from ._checks import as_positions, choice
from .masks import causal_mask, default_positions
from .schemes import NoPE, Scheme

BACKENDS = ("explicit", "sdpa", "flex")


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must have shape (batch, heads, seq_len, head_dim), got {shape}")
    if k.shape != v.shape[:-1] + (k.shape[-1],) or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree on (batch, heads, seq_len): got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch, heads and head_dim")


def _positions(name: str, given, length: int, default: torch.Tensor) -> torch.Tensor:
    if given is None:
        return default
    p = as_positions(name, given, integer=True)
    if p.ndim != 1 or p.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},), got {tuple(p.shape)}")
    return p


def _allowed(q_pos, k_pos, causal: bool, mask, scheme_mask) -> torch.Tensor | None:
    """Combined boolean mask broadcastable to (batch, heads, q_len, k_len), or None for 'all keys'."""
    allowed = causal_mask(q_pos, k_pos) if causal else None
    if scheme_mask is not None:
        allowed = scheme_mask if allowed is None else allowed & scheme_mask
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("mask must be a boolean tensor, True where a query may attend to a key")
        try:
            torch.broadcast_shapes(mask.shape, (1, 1, len(q_pos), len(k_pos)))
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, {len(q_pos)}, {len(k_pos)})") from None
        allowed = mask if allowed is None else mask & allowed.to(mask.device)
    return allowed


def attention_logits(q, k, scheme: Scheme, q_positions, k_positions, scale: float) -> torch.Tensor:
    """Scores q.k * scale plus the scheme's bias, after its query/key transform; no mask."""
    q = scheme.transform_qk(q, q_positions)
    k = scheme.transform_qk(k, k_positions)
    return _scores(q, k, scheme.score_bias(q_positions, k_positions, q), scale)


def _scores(q, k, bias, scale):
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    return scores if bias is None else scores + bias.to(scores.device)


def _explicit(q, k, v, bias, allowed, scale):
    scores = _scores(q, k, bias, scale)
    if allowed is not None:
        scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if allowed is not None:  # a row with no allowed key is all -inf: softmax gives NaN, we give 0
        weights = torch.where(allowed.any(dim=-1, keepdim=True).to(weights.device), weights, 0.0)
    return (weights @ v.float()).to(v.dtype), weights


def _sdpa(q, k, v, bias, allowed, scale, plain_causal: bool):
    if plain_causal and bias is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    attn_mask = None
    if bias is not None:
        attn_mask = bias.to(device=q.device, dtype=q.dtype)
    if allowed is not None:
        blocked = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed.to(q.device), float("-inf"))
        attn_mask = blocked if attn_mask is None else attn_mask + blocked
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    if allowed is not None:
        out = torch.where(allowed.any(dim=-1, keepdim=True).to(out.device), out, 0.0)
    return out


def _flex(q, k, v, score_mod, allowed, scale):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = None
    if allowed is not None:
        full = allowed.to(q.device).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])

        def mask_mod(b, h, q_idx, kv_idx):
            return full[b, h, q_idx, kv_idx]

        block_mask = create_block_mask(mask_mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], device=q.device.type)
    with warnings.catch_warnings():
        # uncompiled FlexAttention warns that it materialises the scores: that is what we want here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scheme: Scheme | None = None,
    *,
    causal: bool = True,
    mask: torch.Tensor | None = None,
    q_positions=None,
    k_positions=None,
    backend: str = "explicit",
    scale: float | None = None,
    return_weights: bool = False,
    keys_transformed: bool = False,
):
    """Scaled dot-product attention with a positional scheme.

    q is (batch, heads, q_len, head_dim); k and v are (batch, heads, k_len, head_dim).
    Positions default to keys at 0..k_len-1 and queries at the last q_len of them.
    `mask` (boolean, True = may attend) is combined with the causal mask. Input-hook
    schemes act on embeddings before the projections, so here they change nothing.
    `keys_transformed=True` says k already went through the scheme's query/key
    transform (a KV cache stores rotated keys). Returns the output, or
    (output, weights) with `return_weights=True` (explicit backend only).
    """
    _check_qkv(q, k, v)
    choice("backend", backend, BACKENDS)
    scheme = NoPE() if scheme is None else scheme
    if not isinstance(scheme, Scheme):
        raise TypeError(f"scheme must be a posenc Scheme (see posenc.make_scheme), got {type(scheme).__name__}")
    if return_weights and backend != "explicit":
        raise ValueError(f"return_weights=True needs backend='explicit'; {backend!r} does not expose the weights")
    if scheme.needs_weights and backend != "explicit":
        raise ValueError(
            f"scheme {scheme.name!r} adds a value term computed from the attention weights, which only backend='explicit' "
            f"exposes; {backend!r} cannot run it (for ShawRelative, values=False keeps the key term only)"
        )
    q_len, k_len, head_dim = q.shape[2], k.shape[2], q.shape[3]
    default_layout = q_positions is None and k_positions is None and q_len == k_len
    default_q, default_k = default_positions(q_len, k_len) if q_positions is None or k_positions is None else (None, None)
    q_pos = _positions("q_positions", q_positions, q_len, default_q)
    k_pos = _positions("k_positions", k_positions, k_len, default_k)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)

    q = scheme.transform_qk(q, q_pos)
    if not keys_transformed:
        k = scheme.transform_qk(k, k_pos)
    scheme_mask = scheme.score_mask(q_pos, k_pos)
    allowed = _allowed(q_pos, k_pos, causal, mask, scheme_mask)
    plain_causal = default_layout and causal and mask is None and scheme_mask is None

    if backend == "explicit":
        out, weights = _explicit(q, k, v, scheme.score_bias(q_pos, k_pos, q), allowed, scale)
        extra = scheme.value_term(weights, q_pos, k_pos)
        if extra is not None:
            out = (out.float() + extra).to(v.dtype)
        return (out, weights) if return_weights else out
    if backend == "sdpa":
        return _sdpa(q, k, v, scheme.score_bias(q_pos, k_pos, q), allowed, scale, plain_causal)
    score_mod = scheme.score_mod(q_pos.to(q.device), k_pos.to(q.device), q)
    if score_mod is None and scheme.score_bias(q_pos[:1], k_pos[:1], q[..., :1, :]) is not None:
        raise ValueError(f"scheme {scheme.name!r} has a score bias but no FlexAttention score_mod; use backend 'explicit' or 'sdpa'")
    return _flex(q, k, v, score_mod, allowed, scale)
