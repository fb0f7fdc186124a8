"""Rotary position embedding (Su et al., RoFormer): the query/key hook.

`rope_frequencies` is a registry of frequency schedules keyed by the `rope_type`
names of Hugging Face transformers; `apply_rope` rotates queries or keys.
"""

from __future__ import annotations

import inspect

import torch

from ._checks import PAIRS, as_positions, choice, positive_float, positive_int, same_last_dim
from .rope_scaling import ROPE_TYPES

LAYOUTS = ("half", "interleaved")


def rope_parameters(rope_type: str) -> dict[str, object]:
    """The parameters a rope_type takes beyond head_dim and base, with their defaults (inspect.Parameter.empty: required)."""
    choice("rope_type", rope_type, tuple(ROPE_TYPES))
    params = list(inspect.signature(ROPE_TYPES[rope_type]).parameters.values())[2:]
    return {p.name: p.default for p in params}


def rope_frequencies(head_dim: int, base: float = 10000.0, rope_type: str = "default", **params) -> tuple[torch.Tensor, float]:
    """Inverse frequencies theta_i, i < head_dim/2, and the attention factor, for a `rope_type`.

    "default" is plain RoPE, theta_i = base^(-2i/head_dim); "linear", "ntk",
    "dynamic", "yarn" and "llama3" rescale it (posenc.rope_scaling; parameters
    named as in Hugging Face's RoPE configs). Returns `(inv_freq, attention_factor)`
    like Hugging Face's RoPE init functions: inv_freq is float32 of length
    head_dim/2 (computed in float64 first), attention_factor multiplies cos and sin.
    """
    positive_int("head_dim", head_dim, even=PAIRS)
    positive_float("base", base, minimum=1.0)
    accepted = rope_parameters(rope_type)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise TypeError(f"rope_type {rope_type!r} does not accept {unknown}; it takes {sorted(accepted) or 'no parameters'}")
    missing = sorted(name for name, default in accepted.items() if default is inspect.Parameter.empty and name not in params)
    if missing:
        raise ValueError(f"rope_type {rope_type!r} needs {', '.join(missing)}")
    return ROPE_TYPES[rope_type](head_dim, base, **params)


def rope_angles(positions, inv_freq: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Angles m * theta_i of shape positions.shape + (len(inv_freq),), formed in `dtype`.

    apply_rope always uses float32. Other dtypes are here to show what goes
    wrong: in bfloat16 a position such as 1000 is not even representable.
    """
    p = as_positions("positions", positions, integer=False)
    if inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must be one-dimensional (head_dim / 2,), got shape {tuple(inv_freq.shape)}")
    return p.to(dtype)[..., None] * inv_freq.to(device=p.device, dtype=dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension (GPT-NeoX, Hugging Face Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) on adjacent pairs (RoFormer, GPT-J)."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, positions, inv_freq: torch.Tensor, layout: str = "half", attention_factor: float = 1.0) -> torch.Tensor:
    """Rotate each pair of dimensions of x by the angle position * theta_i.

    x is `(..., seq_len, head_dim)`; positions is `(seq_len,)` or broadcastable
    to `x.shape[:-1]` (integers, or real numbers for interpolated positions).
    `layout="half"` pairs dimension i with i + head_dim/2; `"interleaved"` pairs
    2i with 2i + 1. Angles are formed in float32 whatever x's dtype; the result
    has x's dtype. cos and sin are multiplied by `attention_factor`.
    """
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        raise ValueError("x must be a tensor of shape (..., seq_len, head_dim)")
    positive_int("head_dim (x.shape[-1])", x.shape[-1], even=PAIRS)
    same_last_dim("x", x, 2 * inv_freq.shape[-1], f"inv_freq of length {inv_freq.shape[-1]}")
    p = as_positions("positions", positions, integer=False).to(x.device)
    try:
        torch.broadcast_shapes(p.shape, x.shape[:-1])
    except RuntimeError:
        raise ValueError(f"positions of shape {tuple(p.shape)} do not broadcast to x.shape[:-1] = {tuple(x.shape[:-1])}") from None
    return apply_rope_angles(x, rope_angles(p, inv_freq, torch.float32), layout, attention_factor)


def rope_rotation_matrix(position: float, inv_freq: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """The (head_dim, head_dim) orthogonal matrix R_m with apply_rope(x, m) = x @ R_m.T, in float64.

    Block-diagonal in the interleaved layout (one 2x2 rotation per pair); the
    same blocks on dimensions (i, i + head_dim/2) in the half layout.
    """
    choice("layout", layout, LAYOUTS)
    angles = float(position) * inv_freq.to(torch.float64)
    half = len(inv_freq)
    first = torch.arange(half) * 2 if layout == "interleaved" else torch.arange(half)
    second = first + 1 if layout == "interleaved" else first + half
    r = torch.zeros(2 * half, 2 * half, dtype=torch.float64)
    r[first, first], r[first, second] = angles.cos(), -angles.sin()
    r[second, first], r[second, second] = angles.sin(), angles.cos()
    return r


def apply_rope_complex(x: torch.Tensor, positions, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE in the complex form: adjacent pairs (x_2i, x_2i+1) as x_2i + i x_2i+1, times e^{i m theta_i}.

    This is the interleaved layout, written as Meta's original LLaMA code
    writes it; it must agree with apply_rope(..., layout="interleaved").
    """
    angles = rope_angles(as_positions("positions", positions, integer=False), inv_freq, torch.float64)
    z = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2).to(x.dtype)


def interleaved_to_half_permutation(head_dim: int) -> torch.Tensor:
    """Index `perm` with x_half = x_interleaved[..., perm]: (0, 2, 4, ..., 1, 3, 5, ...).

    Permuting the rows of each head's Q and K projections by `perm` turns a
    model trained with interleaved pairs into one with identical attention
    under the rotate-half layout (what Hugging Face's Llama conversion script does).
    """
    positive_int("head_dim", head_dim, even=PAIRS)
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def apply_rope_angles(x: torch.Tensor, angles: torch.Tensor, layout: str = "half", attention_factor: float = 1.0) -> torch.Tensor:
    """Rotate each pair of dimensions of x by given angles (..., seq_len, head_dim/2): the second half of apply_rope.

    `apply_rope(x, p, inv_freq, layout)` equals `apply_rope_angles(x, rope_angles(p, inv_freq), layout)`
    bit for bit. Use it with angles formed elsewhere: a cached table, or angles
    formed in a low precision to measure what that costs. cos and sin are taken
    in float32 (float64 when the angles are float64); the result has x's dtype.
    """
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        raise ValueError("x must be a tensor of shape (..., seq_len, head_dim)")
    if not isinstance(angles, torch.Tensor) or not angles.is_floating_point():
        raise TypeError("angles must be a floating-point tensor of shape (..., seq_len, head_dim / 2)")
    choice("layout", layout, LAYOUTS)
    positive_int("head_dim (x.shape[-1])", x.shape[-1], even=PAIRS)
    same_last_dim("x", x, 2 * angles.shape[-1], f"angles with last dimension {angles.shape[-1]}")
    positive_float("attention_factor", attention_factor)
    work = torch.promote_types(angles.dtype, torch.float32)
    angles = angles.to(device=x.device, dtype=work)
    if layout == "half":
        angles, rotate = torch.cat((angles, angles), dim=-1), rotate_half
    else:
        angles, rotate = angles.repeat_interleave(2, dim=-1), rotate_interleaved
    cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
    xf = x.to(work)
    return (xf * cos + rotate(xf) * sin).to(x.dtype)


def rope_decay_bound(distances, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoFormer's relative upper bound (1 / (d/2)) * sum_{j=1}^{d/2} |S_j| at each relative distance r, in float64.

    S_j = sum_{k<j} exp(i r theta_k). By Abel summation the RoPE logit of a query
    and a key r positions apart obeys |logit| <= max_j |h_{j+1} - h_j| * sum_j |S_j|,
    where h_j is the complex product of the j-th pairs of q and k (Su et al., section 3.4.3).
    """
    r = as_positions("distances", distances, integer=False).to(device=inv_freq.device, dtype=torch.float64)
    if inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must be one-dimensional (head_dim / 2,), got shape {tuple(inv_freq.shape)}")
    phases = r[..., None] * inv_freq.to(torch.float64)
    partial_sums = torch.polar(torch.ones_like(phases), phases).cumsum(dim=-1)
    return partial_sums.abs().mean(dim=-1)
