"""RoPE's arithmetic: the angles m theta_i, their cos and sin, the rotation of pairs.

`rope_angles` forms the angles, `rope_cos_sin` their cosines and sines (in float32,
then cast), `rotate_pairs` turns every pair of dimensions by them, and `rotary_dim`
says how many dimensions of a head rotate. posenc.qk.rope chains them for `apply_rope`
and `Rope`; xPos, the multi-axis RoPEs and posenc.qk.rope_forms use them too.
"""

from __future__ import annotations

import torch

from .._checks import PAIRS, as_positions, positive_float, positive_int

#: The parts of a head a partial rotation turns: its first dimensions (GPT-NeoX) or
#: its last (DeepSeek's [nope | rope] heads).
ROTATED_PARTS = ("first", "last")


def rotary_dim(head_dim: int, partial_rotary_factor: float = 1.0) -> int:
    """How many dimensions of each head rotate: int(head_dim * partial_rotary_factor).

    That is Hugging Face's rule; the result must be even.
    """
    positive_int("head_dim", head_dim, even=PAIRS)
    factor = positive_float("partial_rotary_factor", partial_rotary_factor)
    if factor > 1.0:
        raise ValueError(
            "partial_rotary_factor must be in (0, 1] (the fraction of each head that "
            f"rotates), got {factor}"
        )
    rotated = int(head_dim * factor)
    if rotated < 2 or rotated % 2:
        raise ValueError(
            f"partial_rotary_factor={factor} rotates int({head_dim} * {factor}) = "
            f"{rotated} dimensions of each head: it must be an even number >= 2 "
            f"({PAIRS})"
        )
    return rotated


def rope_angles(
    positions, inv_freq: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Angles m * theta_i, of shape positions.shape + (len(inv_freq),), formed in dtype.

    apply_rope uses float32 (float64 for float64 inputs). Other dtypes are here to
    show what goes wrong: bfloat16 holds 8 significant bits, so above 256 it cannot
    represent every integer (1000 is exact, 1001 is rounded to 1000).
    """
    p = as_positions("positions", positions, integer=False)
    if inv_freq.ndim != 1:
        raise ValueError(
            "inv_freq must be one-dimensional (head_dim / 2,), got shape "
            f"{tuple(inv_freq.shape)}"
        )
    return p.to(dtype)[..., None] * inv_freq.to(device=p.device, dtype=dtype)


def _check_x(x) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        raise ValueError("x must be a tensor of shape (..., seq_len, head_dim)")
    positive_int("head_dim (x.shape[-1])", x.shape[-1], even=PAIRS)


def _broadcastable(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Positions shaped to broadcast against x.shape[:-1].

    (batch, seq_len) positions for x of shape (batch, heads, seq_len, d) gain the
    head axis.
    """
    if p.ndim == 2 and x.ndim == 4 and p.shape == (x.shape[0], x.shape[2]):
        p = p[:, None, :]
    try:
        torch.broadcast_shapes(p.shape, x.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"positions of shape {tuple(p.shape)} do not broadcast to x.shape[:-1] = "
            f"{tuple(x.shape[:-1])}"
        ) from None
    return p


def _angle_dtype(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.dtype:
    """float32, or float64 where x or the frequencies are float64: never below float32.

    The dtype in which angles are formed.
    """
    return torch.promote_types(
        torch.float32, torch.promote_types(x.dtype, inv_freq.dtype)
    )


def rope_cos_sin(
    positions, inv_freq: torch.Tensor, like: torch.Tensor, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles position * theta_i, in `like`'s dtype and device.

    Both are of shape (..., seq_len, head_dim/2).

    The angles and their cos and sin are formed in float32 (float64 for float64
    inputs) and only then cast, as Hugging Face does: in bfloat16 the rotation itself
    runs in bfloat16, but no angle is ever rounded to it.
    """
    p = as_positions("positions", positions, integer=False).to(like.device)
    angles = rope_angles(p, inv_freq.to(like.device), _angle_dtype(like, inv_freq))
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(like.dtype), sin.to(like.dtype)


def _pairs(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of every rotated pair, as views.

    Halves (i, i + d/2) in the "half" layout, neighbours (2i, 2i + 1) in "interleaved".
    """
    if layout == "half":
        return x.chunk(2, dim=-1)
    pairs = x.unflatten(-1, (-1, 2))
    return pairs[..., 0], pairs[..., 1]


def rotate_pairs(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    rotated_part: str = "first",
) -> torch.Tensor:
    """(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) on every pair.

    cos and sin are of shape (..., seq_len, rotated/2). The first `rotated` =
    2 * cos.shape[-1] dimensions of x are paired and rotated (all of them unless the
    rotation is partial); the rest pass through, as in GPT-NeoX. With
    `rotated_part="last"` the last ones rotate instead: the [nope | rope] heads of
    DeepSeek's multi-head latent attention.
    Each product is rounded before the sum, as in Hugging Face's
    `q * cos + rotate_half(q) * sin`, so with the same cos and sin the result is
    bit-identical to it. Without gradients the output is x times cos (cos repeated to
    the head's width) in one pass over contiguous memory, and each half then takes its
    sin product in place through one half-size scratch buffer (no rotate_half copy; on
    a CPU, short strided loops over the halves cost more than one contiguous pass);
    with gradients the same arithmetic runs out of place (torch's out= records no
    graph), and so it does under torch.compile: the compiler fuses the out-of-place
    form into one loop at a copy's speed, while the out= writes into views of one
    buffer make it copy and scatter (on a CPU, 9 times slower;
    chapters/benchmark.ipynb).
    """
    rotated = 2 * cos.shape[-1]
    if rotated < x.shape[-1]:
        if rotated_part == "last":
            turned = rotate_pairs(x[..., -rotated:], cos, sin, layout)
            return torch.cat(
                (
                    x[..., :-rotated].to(turned.dtype).expand(*turned.shape[:-1], -1),
                    turned,
                ),
                -1,
            )
        turned = rotate_pairs(x[..., :rotated], cos, sin, layout)
        return torch.cat(
            (turned, x[..., rotated:].to(turned.dtype).expand(*turned.shape[:-1], -1)),
            -1,
        )
    x1, x2 = _pairs(x, layout)
    if torch.compiler.is_compiling() or (
        torch.is_grad_enabled()
        and (x.requires_grad or cos.requires_grad or sin.requires_grad)
    ):
        first, second = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        return (
            torch.cat((first, second), -1)
            if layout == "half"
            else torch.stack((first, second), -1).flatten(-2)
        )
    both = (
        torch.cat((cos, cos), -1)
        if layout == "half"
        else torch.stack((cos, cos), -1).flatten(-2)
    )
    out = x * both  # (x1 cos, x2 cos), each product rounded
    o1, o2 = _pairs(out, layout)
    scratch = torch.mul(x2, sin)
    o1.sub_(scratch)
    torch.mul(x1, sin, out=scratch)
    o2.add_(scratch)
    return out
