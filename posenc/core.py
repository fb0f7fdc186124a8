"""One attention entry point for every scheme, with interchangeable backends.

* ``"explicit"`` materialises the (batch, heads, q_len, k_len) scores and can return the weights;
* ``"sdpa"`` calls torch.nn.functional.scaled_dot_product_attention: ``is_causal=True`` when the
  mask is plain causal and there is no bias, else one additive float mask (cached per shape where
  the scheme's bias has no learned parameters);
* ``"flex"`` runs FlexAttention compiled (torch.compile, dynamic=False) with the scheme's bias
  inside the kernel and a block mask cached per shape;
* ``"flex_uncompiled"`` is the same without compiling: correct and slow (it materialises the
  scores), for reading and for shapes too varied to compile.

All backends agree, and return zeros, not NaN, for a query whose every key is masked.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from functools import lru_cache

import torch
import torch.nn.functional as F

from ._checks import choice
from .kernel import bias_table, block_mask, index_score_mod, kept, mask_table
from .layer import sink_factor, softcap_score_mod, softcapped
from .positions import Positions
from .scheme import NoPE, Scheme

BACKENDS = ("explicit", "sdpa", "flex", "flex_uncompiled")
_NOPE = NoPE()


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must have shape (batch, heads, seq_len, head_dim), got {shape}"
            )
    if k.shape != v.shape[:-1] + (k.shape[-1],) or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must agree on (batch, heads, seq_len): got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch, heads and head_dim"
        )


def _check_mask(mask, q_len: int, k_len: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            "mask must be a boolean tensor, True where a query may attend to a key"
        )
    try:
        torch.broadcast_shapes(mask.shape, (1, 1, q_len, k_len))
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, {q_len}, {k_len})"
        ) from None


def _check_scheme_mask(scheme: Scheme, causal: bool, batch: int) -> None:
    if scheme.sees_later_keys and causal:
        raise ValueError(
            f"scheme {scheme.name!r} has a mask that lets queries see later keys ({scheme.mask_key()[0]}), which causal=True would "
            "remove: pass causal=False (the mask is causal itself where it should be)"
        )
    if scheme.mask_rows is not None and scheme.mask_rows != batch:
        raise ValueError(
            f"scheme {scheme.name!r} has a mask for a batch of {scheme.mask_rows} sequences, but q has batch {batch}"
        )


def _allowed(scheme, positions, causal, mask, device) -> torch.Tensor | None:
    allowed = mask_table(scheme, positions, causal, device)
    if mask is not None:
        allowed = mask.to(device) if allowed is None else allowed & mask.to(device)
    return allowed


def _zero_empty_rows(out: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Zeros for queries that may attend to no key at all (a softmax over nothing is NaN)."""
    return torch.where(allowed.any(dim=-1, keepdim=True), out, 0.0)


def _resolve(
    q,
    k,
    scheme: Scheme,
    q_positions,
    k_positions,
    q_coords,
    k_coords,
    keys_transformed: bool,
    documents=(None, None),
) -> Positions:
    if (
        q_coords is not None
        and k_coords is None
        and not keys_transformed
        and scheme.position_axes > 1
    ):
        raise ValueError(
            "q_coords needs k_coords (the keys' coordinates on the same axes), unless keys_transformed=True"
        )
    return Positions.resolve(
        q_positions,
        k_positions,
        q.shape[2],
        k.shape[2],
        q.shape[0],
        q.device,
        q_coords=q_coords,
        k_coords=k_coords,
        axes=scheme.position_axes,
        keys_transformed=keys_transformed,
        q_documents=documents[0],
        k_documents=documents[1],
    )


def attention_logits(
    q,
    k,
    scheme: Scheme,
    q_positions,
    k_positions,
    scale: float,
    *,
    q_coords=None,
    k_coords=None,
) -> torch.Tensor:
    """Scores q.k * scale plus the scheme's bias, after its query/key transform; no mask. Float32."""
    positions = _resolve(
        q,
        k,
        scheme,
        q_positions,
        k_positions,
        q_coords,
        k_coords,
        keys_transformed=False,
    )
    q = scheme.transform_qk(q, positions.query_positions())
    k = scheme.transform_k(k, positions.key_positions())
    bias = bias_table(scheme, positions, q)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    return scores if bias is None else scores + bias


def _explicit(q, k, v, scheme, positions, bias, allowed, scale):
    scores = softcapped(
        (q.float() @ k.float().transpose(-1, -2)) * scale, scheme.softcap
    )
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    sinks = getattr(scheme, "sinks", None)
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:  # one more logit per row, s_h, whose weight goes nowhere
        column = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat((scores, column), dim=-1), dim=-1)[..., :-1]
    if allowed is not None:
        weights = _zero_empty_rows(weights, allowed)
    out = weights @ v.float()
    extra = scheme.value_term(weights, positions)
    if extra is not None:
        out = out + extra
    return out.to(v.dtype), weights


def _float_mask(bias, allowed, dtype) -> torch.Tensor | None:
    """The bias with -inf where a key is masked, in the queries' dtype: SDPA's one additive mask."""
    if allowed is None:
        return None if bias is None else bias.to(dtype)
    return torch.where(
        allowed,
        torch.zeros((), dtype=torch.float32, device=allowed.device)
        if bias is None
        else bias,
        float("-inf"),
    ).to(dtype)


def _with_sink_key(q, k, v, float_mask, sinks):
    """k and v with one key of zeros appended, whose additive mask is the head's sink logit: sdpa's softmax with a sink."""
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


def _sdpa(q, k, v, scheme, positions, bias, causal, mask, scale, guard_rows):
    sinks = getattr(scheme, "sinks", None)
    plain_causal = (
        causal
        and positions.is_default
        and mask is None
        and scheme.mask_mod is None
        and q.shape[2] == k.shape[2]
    )
    if bias is None and plain_causal and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    allowed = _allowed(scheme, positions, causal, mask, q.device)
    if (
        positions.key() is not None
        and mask is None
        and (bias is None or scheme.bias_is_constant)
    ):
        # nothing here depends on learned parameters: one additive mask per shape, device and dtype
        key = ("sdpa", positions.key(), causal, q.shape[1], q.device, q.dtype)
        make = lambda: _float_mask(bias, allowed, q.dtype)  # noqa: E731
        float_mask = (
            kept(key + (scheme.mask_key(),), make)
            if bias is None
            else scheme.cached(key, make)
        )
    else:
        float_mask = _float_mask(bias, allowed, q.dtype)
    if sinks is not None:
        k, v, float_mask = _with_sink_key(q, k, v, float_mask, sinks)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, scale=scale)
    return _zero_empty_rows(out, allowed) if guard_rows and allowed is not None else out


def _lse_request() -> dict:
    """The keyword that makes FlexAttention return its log-sum-exp: return_aux (torch >= 2.9) or return_lse."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


_LSE = _lse_request()


@lru_cache(maxsize=None)
def compiled_flex_attention():
    """FlexAttention compiled once per process (dynamic=False: one kernel per shape, as fast as it gets)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def cpu_compiles_flex() -> bool:
    """Whether torch's inductor can compile FlexAttention for this CPU: its own test (torch/_inductor/kernel/flex/flex_cpu.py)."""
    return (
        torch.cpu._is_avx2_supported()
        and os.environ.get("ATEN_CPU_CAPABILITY") != "default"
        and sys.platform != "darwin"
    )


def _flex(q, k, v, scheme, positions, causal, mask, scale, compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cpu" and torch.is_grad_enabled():
        # torch's CPU FlexAttention has no backward; uncompiled, it still differentiates a captured table
        learned = (
            compiled
            and scheme.hook == "score"
            and any(p.requires_grad for p in scheme.parameters())
        )
        if learned or any(t.requires_grad for t in (q, k, v)):
            raise ValueError(
                f"FlexAttention has no backward pass on the CPU in torch {torch.__version__}: to train on the CPU use "
                "backend='sdpa' or 'explicit'; on CUDA both flex backends train (under torch.no_grad() flex runs here)"
            )
    if (
        compiled
        and q.device.type == "cpu"
        and getattr(scheme, "sinks", None) is not None
    ):
        raise ValueError(
            f"scheme {scheme.name!r} has sink logits, which FlexAttention applies through its log-sum-exp; compiled for the "
            f"CPU, torch {torch.__version__} cannot return it: use backend='flex_uncompiled', 'sdpa' or 'explicit' here "
            "(on CUDA, backend='flex' runs them)"
        )
    if compiled and q.device.type == "cpu" and not cpu_compiles_flex():
        raise ValueError(
            f"backend='flex' compiles FlexAttention, which torch {torch.__version__} cannot do for the CPU here (it needs AVX2, "
            f"ATEN_CPU_CAPABILITY other than 'default', and not macOS): use backend='flex_uncompiled' (the same results, slower), "
            "'sdpa' or 'explicit'"
        )
    score_mod = index_score_mod(scheme, positions, q)
    if scheme.softcap is not None:
        score_mod = softcap_score_mod(scheme.softcap, score_mod)
    blocks = block_mask(scheme, positions, causal, q, k, mask)
    sinks = getattr(scheme, "sinks", None)
    run = compiled_flex_attention() if compiled else flex_attention
    with warnings.catch_warnings():
        # uncompiled FlexAttention warns that it materialises the scores: that is what this backend is for
        warnings.filterwarnings(
            "ignore", message=".*flex_attention called without torch.compile.*"
        )
        if sinks is None:
            return run(q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale)
        out, lse = run(
            q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale, **_LSE
        )
    out, lse = (out, lse.lse) if hasattr(lse, "lse") else (out, lse)
    return (out.float() * sink_factor(lse, sinks)).to(out.dtype)


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
    q_coords=None,
    k_coords=None,
    q_documents=None,
    k_documents=None,
    backend: str = "explicit",
    scale: float | None = None,
    return_weights: bool = False,
    keys_transformed: bool = False,
):
    """Scaled dot-product attention with a positional scheme.

    q is (batch, heads, q_len, head_dim); k and v are (batch, heads, k_len, head_dim).
    Positions are (len,) or (batch, len) integer tensors; without them keys sit at
    0..k_len-1 and queries at the last q_len of them. `mask` (boolean, True = may
    attend, broadcastable to (batch, heads, q_len, k_len)) is combined with the causal
    mask and the scheme's own. Positions that start again from 0 inside a row ([0, 1, 2, 0, 1])
    mark documents packed in one row, and each sees only itself (posenc.positions says the rule).
    Input-hook schemes act on embeddings before the
    projections, so here they change nothing. `keys_transformed=True` says k already
    went through the scheme's query/key transform (a KV cache stores rotated keys).
    For a scheme with several position axes (scheme.position_axes > 1), `q_coords` and
    `k_coords` ((axes, len) or (axes, batch, len): rows and columns of image patches,
    Qwen2-VL's time, height and width ids) go to its query/key transform, while the
    mask and any bias follow the 1-D positions (by default the order of the sequence);
    without k_coords, queries take the last q_len of them. A scheme whose mask lets a
    query see later keys (posenc.score.masks.prefix_lm, causal_with_blocks) needs causal=False.
    `q_documents` and `k_documents` ((len,) or (batch, len) integers, both or neither) name each
    token's document in a packed stream, as flash-attention's cu_seqlens do
    (posenc.positions.packed turns those into positions and ids): a query sees only keys of
    its own document, whatever the positions, so queries from several documents can decode together.
    Returns the output, or (output, weights) with `return_weights=True` (explicit only).
    """
    _check_qkv(q, k, v)
    choice("backend", backend, BACKENDS)
    scheme = _NOPE if scheme is None else scheme
    if not isinstance(scheme, Scheme):
        raise TypeError(
            f"scheme must be a posenc Scheme (see posenc.make_scheme), got {type(scheme).__name__}"
        )
    scheme.check_device(q.device)
    if return_weights and backend != "explicit":
        raise ValueError(
            f"return_weights=True needs backend='explicit'; {backend!r} does not expose the weights"
        )
    if scheme.softcap is not None and backend == "sdpa":
        raise ValueError(
            f"scheme {scheme.name!r} caps its logits (softcap={scheme.softcap:g}, cap * tanh(logit / cap)), which "
            "backend='sdpa' cannot express: use backend='explicit' or 'flex'"
        )
    if scheme.needs_weights and backend != "explicit":
        raise ValueError(
            f"scheme {scheme.name!r} adds a value term computed from the attention weights, which only backend='explicit' "
            f"exposes; {backend!r} cannot run it (for ShawRelative, values=False keeps the key term only)"
        )
    q_len, k_len = q.shape[2], k.shape[2]
    _check_mask(mask, q_len, k_len)
    _check_scheme_mask(scheme, causal, q.shape[0])
    positions = _resolve(
        q,
        k,
        scheme,
        q_positions,
        k_positions,
        q_coords,
        k_coords,
        keys_transformed,
        (q_documents, k_documents),
    )
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)

    q = scheme.transform_qk(q, positions.query_positions())
    if not keys_transformed:
        k = scheme.transform_k(k, positions.key_positions())
    if backend in ("flex", "flex_uncompiled"):
        return _flex(
            q, k, v, scheme, positions, causal, mask, scale, compiled=backend == "flex"
        )
    bias = bias_table(scheme, positions, q)
    guard_rows = mask is not None or not positions.is_default
    if backend == "sdpa":
        return _sdpa(q, k, v, scheme, positions, bias, causal, mask, scale, guard_rows)
    out, weights = _explicit(
        q,
        k,
        v,
        scheme,
        positions,
        bias,
        _allowed(scheme, positions, causal, mask, q.device),
        scale,
    )
    return (out, weights) if return_weights else out
