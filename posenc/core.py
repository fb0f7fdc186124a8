"""One attention entry point for every scheme, with interchangeable backends.

* ``"explicit"`` materialises the (batch, heads, q_len, k_len) scores and can return
  the weights;
* ``"sdpa"`` calls torch.nn.functional.scaled_dot_product_attention: ``is_causal=True``
  when the mask is plain causal and there is no bias, else one additive float mask
  (cached per shape where the scheme's bias has no learned parameters);
* ``"flex"`` runs FlexAttention compiled (torch.compile, dynamic=False) with the
  scheme's bias inside the kernel and a block mask cached per shape (its helpers are in
  posenc.flex);
* ``"flex_uncompiled"`` is the same without compiling: correct and slow (it
  materialises the scores), for reading and for shapes too varied to compile.

All backends agree, and return zeros, not NaN, for a query whose every key is masked.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn.functional as F

from ._checks import check_mask, check_qkv, check_scheme_mask, choice
from .flex import LSE, call_fitting, compiled_flex_attention, cpu_compiles_flex
from .flex import flex_kernel_options  # noqa: F401 - read from here too
from .kernel import (
    additive_mask,
    bias_table,
    block_mask,
    index_score_mod,
    kept,
    mask_table,
)
from .layer import sink_factor, softcap_score_mod, softcapped, with_sink_key
from .positions import Positions
from .scheme import NoPE, Scheme

#: The names of the backends of `attention`. ``"explicit"`` materialises the scores
#: (the only one that returns the weights or runs a value term), ``"sdpa"`` calls
#: torch.nn.functional.scaled_dot_product_attention, ``"flex"`` compiles FlexAttention
#: and ``"flex_uncompiled"`` runs it eagerly. All give the same output.
BACKENDS = ("explicit", "sdpa", "flex", "flex_uncompiled")
_NOPE = NoPE()


def _allowed(scheme, positions, causal, mask, device) -> torch.Tensor | None:
    allowed = mask_table(scheme, positions, causal, device)
    if mask is not None:
        allowed = mask.to(device) if allowed is None else allowed & mask.to(device)
    return allowed


def _zero_empty_rows(out: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Zeros for queries that may attend to no key at all (a softmax over nothing is
    NaN)."""
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
            "q_coords needs k_coords (the keys' coordinates on the same axes), "
            "unless keys_transformed=True"
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
    """Scores q.k * scale plus the scheme's bias, after its query/key transform; no
    mask. Float32."""
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
        # nothing here depends on learned parameters: one additive mask per shape,
        # device and dtype
        key = ("sdpa", positions.key(), causal, q.shape[1], q.device, q.dtype)
        make = lambda: additive_mask(bias, allowed, q.dtype)  # noqa: E731
        float_mask = (
            kept(key + (scheme.mask_key(),), make)
            if bias is None
            else scheme.cached(key, make)
        )
    else:
        float_mask = additive_mask(bias, allowed, q.dtype)
    if sinks is not None:
        k, v, float_mask = with_sink_key(q, k, v, float_mask, sinks)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, scale=scale)
    return _zero_empty_rows(out, allowed) if guard_rows and allowed is not None else out


def _flex(q, k, v, scheme, positions, causal, mask, scale, compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cpu" and torch.is_grad_enabled():
        # torch's CPU FlexAttention has no backward; uncompiled, it still
        # differentiates a captured table
        learned = (
            compiled
            and scheme.hook == "score"
            and any(p.requires_grad for p in scheme.parameters())
        )
        if learned or any(t.requires_grad for t in (q, k, v)):
            raise ValueError(
                "FlexAttention has no backward pass on the CPU in torch "
                f"{torch.__version__}: to train on the CPU use backend='sdpa' or "
                "'explicit'; on CUDA both flex backends train "
                "(under torch.no_grad() flex runs here)"
            )
    if (
        compiled
        and q.device.type == "cpu"
        and getattr(scheme, "sinks", None) is not None
    ):
        raise ValueError(
            f"scheme {scheme.name!r} has sink logits, which FlexAttention applies "
            "through its log-sum-exp; compiled for the CPU, torch "
            f"{torch.__version__} cannot return it: use backend='flex_uncompiled', "
            "'sdpa' or 'explicit' here (on CUDA, backend='flex' runs them)"
        )
    if compiled and q.device.type == "cpu" and not cpu_compiles_flex():
        raise ValueError(
            f"backend='flex' compiles FlexAttention, which torch {torch.__version__} "
            "cannot do for the CPU here (it needs AVX2, ATEN_CPU_CAPABILITY other "
            "than 'default', and not macOS): use backend='flex_uncompiled' "
            "(the same results, slower), 'sdpa' or 'explicit'"
        )
    score_mod = index_score_mod(scheme, positions, q)
    if scheme.softcap is not None:
        score_mod = softcap_score_mod(scheme.softcap, score_mod)
    blocks = block_mask(scheme, positions, causal, q, k, mask)
    sinks = getattr(scheme, "sinks", None)
    run = flex_attention
    if compiled:  # blocks that fit the GPU's shared memory (a T4, an L4; T5 on an H100)
        key = (scheme.name, str(q.device), q.dtype, q.shape[-1], k.shape[-1])
        run = functools.partial(call_fitting, compiled_flex_attention(), q.device, key)
    with warnings.catch_warnings():
        # uncompiled FlexAttention warns that it materialises the scores: that is what
        # this backend is for
        warnings.filterwarnings(
            "ignore", message=".*flex_attention called without torch.compile.*"
        )
        if sinks is None:
            return run(q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale)
        out, lse = run(
            q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale, **LSE
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
    """Scaled dot-product attention with a positional scheme, on one of `BACKENDS`.

    The scheme's query/key transform acts on `q` and `k`, its bias and mask on the
    scores (input-hook schemes act on embeddings before the projections: here they
    change nothing). All backends agree, and give zeros, not NaN, to a query whose
    every key is masked; what a backend cannot express is refused by name. Positions
    that start again from 0 inside a row ([0, 1, 2, 0, 1]) mark documents packed in
    one row, and each sees only itself (posenc.positions says the rule).

    Args:
        q: queries, (batch, heads, q_len, head_dim).
        k: keys, (batch, heads, k_len, head_dim).
        v: values, (batch, heads, k_len, head_dim_v).
        scheme: a posenc Scheme (`make_scheme`); None for NoPE.
        causal: mask keys at later positions than the query. A scheme whose mask lets
            a query see later keys (posenc.score.masks.prefix_lm, causal_with_blocks)
            needs causal=False.
        mask: boolean, True where a query may attend, broadcastable to
            (batch, heads, q_len, k_len).
        q_positions: the queries' positions, (q_len,) or (batch, q_len) integers.
        k_positions: the keys' positions, (k_len,) or (batch, k_len). Without
            positions keys sit at 0..k_len-1 and queries at the last q_len of them.
        q_coords: for a scheme with several position axes (`position_axes` > 1), the
            queries' coordinates, (axes, q_len) or (axes, batch, q_len) (rows and
            columns of image patches, Qwen2-VL's time, height and width ids), for the
            query/key transform only: the mask and any bias follow the 1-D positions.
            Without them queries take the last q_len of `k_coords`.
        k_coords: the keys' coordinates, (axes, k_len) or (axes, batch, k_len).
        q_documents: each query's document in a packed stream, the shape of its
            positions, as flash-attention's cu_seqlens say (posenc.positions.packed
            turns those into positions and ids): a query sees only keys of its own
            document, whatever the positions.
        k_documents: each key's document; with `q_documents` or not at all.
        backend: ``"explicit"``, ``"sdpa"``, ``"flex"`` or ``"flex_uncompiled"``.
        scale: the factor on q.k; None for 1/sqrt(head_dim).
        return_weights: also return the attention weights (explicit backend only).
        keys_transformed: `k` already went through the scheme's query/key transform
            (a KV cache stores rotated keys).

    Returns:
        The output, (batch, heads, q_len, head_dim_v), in the dtype of `v`; with
        ``return_weights=True``, (output, weights), the weights float32
        (batch, heads, q_len, k_len).

    Raises:
        ValueError: the shapes of `q`, `k`, `v`, `mask`, positions, coordinates or
            documents do not fit (or q_len > k_len without positions); `backend` is
            unknown; the scheme is on another device than `q`, or its mask needs
            causal=False or another batch; the backend cannot run what is asked
            (weights, a value term, a softcap; FlexAttention's backward or sink
            logits or compiling on this CPU).
        TypeError: `scheme` is not a Scheme; `mask` is not boolean; positions or
            documents are not integers.

    Example:
        >>> import torch, posenc
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 2, 4, 10, 16, generator=g)
        >>> rope = posenc.Rope(head_dim=16)
        >>> out, weights = posenc.attention(q, k, v, rope, return_weights=True)
        >>> out.shape, weights.shape
        (torch.Size([2, 4, 10, 16]), torch.Size([2, 4, 10, 10]))
        >>> bool(weights[..., 0, 1:].eq(0).all())  # causal: query 0 sees only itself
        True
        >>> sdpa = posenc.attention(q, k, v, rope, backend="sdpa")
        >>> torch.testing.assert_close(sdpa, out)
        >>> alibi = posenc.ALiBi(num_heads=4)
        >>> flex = posenc.attention(q, k, v, alibi, backend="flex_uncompiled")
        >>> torch.testing.assert_close(flex, posenc.attention(q, k, v, alibi))
    """
    check_qkv(q, k, v)
    choice("backend", backend, BACKENDS)
    scheme = _NOPE if scheme is None else scheme
    if not isinstance(scheme, Scheme):
        raise TypeError(
            "scheme must be a posenc Scheme (see posenc.make_scheme), "
            f"got {type(scheme).__name__}"
        )
    scheme.check_device(q.device)
    if return_weights and backend != "explicit":
        raise ValueError(
            f"return_weights=True needs backend='explicit'; {backend!r} "
            "does not expose the weights"
        )
    if scheme.softcap is not None and backend == "sdpa":
        raise ValueError(
            f"scheme {scheme.name!r} caps its logits (softcap={scheme.softcap:g}, "
            "cap * tanh(logit / cap)), which backend='sdpa' cannot express: "
            "use backend='explicit' or 'flex'"
        )
    if scheme.needs_weights and backend != "explicit":
        raise ValueError(
            f"scheme {scheme.name!r} adds a value term computed from the attention "
            f"weights, which only backend='explicit' exposes; {backend!r} cannot run "
            "it (for ShawRelative, values=False keeps the key term only)"
        )
    q_len, k_len = q.shape[2], k.shape[2]
    check_mask(mask, q_len, k_len)
    check_scheme_mask(scheme, causal, q.shape[0])
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
