"""RoPE written other ways, for the chapters' checks and figures.

The rotation as a matrix and as complex numbers, the rotate-half and interleaved
rewritings, the permutation between the two pair layouts, rotation by angles formed
elsewhere, and Su et al.'s bound on the logits. posenc.qk.rope computes RoPE one way;
these say the same thing in the forms papers and other code use.
"""

from __future__ import annotations

import torch

from .._checks import as_positions, choice, positive_float, same_last_dim
from .rope import LAYOUTS
from .rotation import ROTATED_PARTS, _check_x, rope_angles, rotary_dim, rotate_pairs


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension.

    The rotate-half layout of GPT-NeoX and Hugging Face's Llama.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) on adjacent pairs.

    The interleaved layout of RoFormer and GPT-J.
    """
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def rope_rotation_matrix(
    position: float, inv_freq: torch.Tensor, layout: str = "half"
) -> torch.Tensor:
    """The (head_dim, head_dim) orthogonal matrix R_m with apply_rope(x, m) = x @ R_m.T.

    In float64.
    It is block-diagonal in the interleaved layout (one 2x2 rotation per pair); the
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


def apply_rope_complex(
    x: torch.Tensor, positions, inv_freq: torch.Tensor
) -> torch.Tensor:
    """RoPE in the complex form: each pair of neighbours as one complex number.

    Pair j, (x_2j, x_2j+1), becomes z_j = x_2j + 1j * x_2j+1 (1j the imaginary unit)
    and is multiplied by exp(1j * m * theta_j). This is the interleaved layout,
    written as Meta's original LLaMA code writes it; it must agree with
    apply_rope(..., layout="interleaved").
    """
    angles = rope_angles(
        as_positions("positions", positions, integer=False), inv_freq, torch.float64
    )
    z = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
    return (
        torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles))
        .flatten(-2)
        .to(x.dtype)
    )


def interleaved_to_half_permutation(
    head_dim: int, partial_rotary_factor: float = 1.0, rotated_part: str = "first"
) -> torch.Tensor:
    """Index `perm` with x_half = x_interleaved[..., perm]: (0, 2, 4, ..., 1, 3, ...).

    Permuting the rows of each head's Q and K projections by `perm` turns a
    model trained with interleaved pairs into one with identical attention
    under the rotate-half layout (what Hugging Face's Llama conversion script does).
    With `partial_rotary_factor` < 1 only the rotated dimensions are paired, so the
    permutation acts inside them (the first int(head_dim * factor), or the last ones
    with `rotated_part="last"`) and leaves the others where they are: GPT-J's
    checkpoints (head_dim 256, 64 rotated) need
    `interleaved_to_half_permutation(256, 0.25)`, not the permutation of the whole
    head.
    """
    choice("rotated_part", rotated_part, ROTATED_PARTS)
    rotated = rotary_dim(head_dim, partial_rotary_factor)
    inside = torch.cat((torch.arange(0, rotated, 2), torch.arange(1, rotated, 2)))
    kept = torch.arange(head_dim - rotated)
    if rotated_part == "last":
        return torch.cat((kept, head_dim - rotated + inside))
    return torch.cat((inside, rotated + kept))


def apply_rope_angles(
    x: torch.Tensor,
    angles: torch.Tensor,
    layout: str = "half",
    attention_factor: float = 1.0,
) -> torch.Tensor:
    """Rotate each pair of dimensions of x by given angles (apply_rope's second half).

    angles are of shape (..., seq_len, head_dim/2).
    Use it with angles formed elsewhere, for example in a low precision to measure
    what that costs. cos and sin are taken in the angles' dtype (at least float32),
    then cast to x's dtype, as apply_rope does.
    """
    _check_x(x)
    if not isinstance(angles, torch.Tensor) or not angles.is_floating_point():
        raise TypeError(
            "angles must be a floating-point tensor of shape "
            "(..., seq_len, head_dim / 2)"
        )
    choice("layout", layout, LAYOUTS)
    same_last_dim(
        "x", x, 2 * angles.shape[-1], f"angles with last dimension {angles.shape[-1]}"
    )
    positive_float("attention_factor", attention_factor)
    angles = angles.to(
        device=x.device, dtype=torch.promote_types(angles.dtype, torch.float32)
    )
    cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
    return rotate_pairs(x, cos.to(x.dtype), sin.to(x.dtype), layout)


def rope_decay_bound(distances, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoFormer's relative upper bound (1 / (d/2)) sum_{j=1}^{d/2} |S_j| at distance r.

    In float64. S_j = sum_{l<j} exp(1j * r * theta_l), pairs indexed by j and l (1j the
    imaginary unit). By Abel summation the RoPE logit of a query and a key r
    positions apart obeys |logit| <= max_j |h_{j+1} - h_j| * sum_j |S_j|, where h_j
    is the complex product of the j-th pairs of q and k (Su et al., section 3.4.3).
    """
    r = as_positions("distances", distances, integer=False).to(
        device=inv_freq.device, dtype=torch.float64
    )
    if inv_freq.ndim != 1:
        raise ValueError(
            "inv_freq must be one-dimensional (head_dim / 2,), got shape "
            f"{tuple(inv_freq.shape)}"
        )
    phases = r[..., None] * inv_freq.to(torch.float64)
    partial_sums = torch.polar(torch.ones_like(phases), phases).cumsum(dim=-1)
    return partial_sums.abs().mean(dim=-1)
