"""Rotary position embedding (Su et al., RoFormer): the query/key hook and its scheme.

`rope_frequencies` is a registry of frequency schedules keyed by the `rope_type`
names of Hugging Face transformers; `apply_rope` rotates queries or keys; `Rope`
is the scheme, which keeps a cos/sin table per length, device and dtype.
"""

from __future__ import annotations

import inspect

import torch

from .._checks import (
    PAIRS,
    as_positions,
    choice,
    positive_float,
    positive_int,
    same_last_dim,
)
from ..scheme import Scheme, register
from .rope_scaling import ROPE_TYPES, rope_parameters, rotary_dim

LAYOUTS = ("half", "interleaved")


NUMERICS = {"float64": torch.float64, "transformers": torch.float32}


def rope_frequencies(
    head_dim: int,
    base: float = 10000.0,
    rope_type: str = "default",
    numerics: str = "float64",
    partial_rotary_factor: float = 1.0,
    **params,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies theta_i (i < rotated/2) and attention factor of a rope_type.

    "default" is plain RoPE, theta_i = base^(-2i/head_dim); "linear", "ntk",
    "dynamic", "yarn", "longrope" and "llama3" rescale it, and "proportional" (p-RoPE)
    truncates it (posenc.qk.rope_scaling; parameters named as in Hugging Face's RoPE
    configs). Returns `(inv_freq, attention_factor)` like Hugging Face's RoPE init
    functions: inv_freq is float32 of length rotated/2, attention_factor multiplies
    cos and sin.

    `partial_rotary_factor` < 1 rotates only the first int(head_dim * factor) dimensions
    of each head (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor): every schedule is
    then formed for that rotated width, which changes the NTK exponent d/(d - 2) and
    YaRN's correction range, as in Hugging Face. "proportional" reads the factor
    itself: the whole head is paired, and the pairs past the fraction get frequency 0.

    `numerics="float64"` (the default) forms the frequencies in float64 and rounds once,
    so each is the float32 nearest the formula. `numerics="transformers"` forms them in
    float32 with transformers' operations, reproducing its `inv_freq` bit for bit: those
    differ by up to one float32 ulp for power-of-two head widths, and by several where
    2i/head_dim is itself rounded in float32 (up to 5 for head_dim 80 or 96 at bases
    up to 1e6), which at position 131071 moves an angle by up to about 1e-2 rad.
    Use it to run a checkpoint trained with transformers exactly as it was trained.
    """
    choice("numerics", numerics, tuple(NUMERICS))
    positive_float("base", base, minimum=1.0)
    accepted = rope_parameters(rope_type)
    if "partial_rotary_factor" in accepted:
        # a schedule that reads the factor itself (proportional) pairs the whole head
        positive_int("head_dim", head_dim, even=PAIRS)
        rotated, params = (
            head_dim,
            {**params, "partial_rotary_factor": partial_rotary_factor},
        )
    else:
        rotated = rotary_dim(head_dim, partial_rotary_factor)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise TypeError(
            f"rope_type {rope_type!r} does not accept {unknown}; it takes "
            f"{sorted(accepted) or 'no parameters'}"
        )
    missing = sorted(
        name
        for name, default in accepted.items()
        if default is inspect.Parameter.empty and name not in params
    )
    if missing:
        raise ValueError(f"rope_type {rope_type!r} needs {', '.join(missing)}")
    inv_freq, attention_factor = ROPE_TYPES[rope_type](
        rotated, base, NUMERICS[numerics], **params
    )
    return inv_freq.float(), attention_factor


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
    bit-identical to it. Without gradients it is written into one output tensor with a
    single half-size scratch buffer (no rotate_half copy, no full-size temporaries);
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
    shape = torch.broadcast_shapes(x.shape[:-1], cos.shape[:-1]) + (x.shape[-1],)
    out = torch.empty(
        shape, dtype=torch.promote_types(x.dtype, cos.dtype), device=x.device
    )
    o1, o2 = _pairs(out, layout)
    scratch = torch.mul(x2, sin)
    torch.mul(x1, cos, out=o1).sub_(scratch)
    torch.mul(x1, sin, out=scratch)
    torch.mul(x2, cos, out=o2).add_(scratch)
    return out


ROTATED_PARTS = ("first", "last")


def apply_rope(
    x: torch.Tensor,
    positions,
    inv_freq: torch.Tensor,
    layout: str = "half",
    attention_factor: float = 1.0,
    partial_rotary_factor: float = 1.0,
    rotated_part: str = "first",
) -> torch.Tensor:
    """Rotate each pair of dimensions of x by the angle position * theta_i.

    x is `(..., seq_len, head_dim)`; positions is `(seq_len,)`, `(batch, seq_len)` for x
    of shape (batch, heads, seq_len, head_dim), or broadcastable to `x.shape[:-1]`
    (integers, or real numbers for interpolated positions). `layout="half"` pairs
    dimension i with i + head_dim/2; `"interleaved"` pairs 2i with 2i + 1. Angles and
    their cos and sin are formed in float32 (float64 for float64 inputs), then cast to
    x's dtype, in which the rotation runs; cos and sin are multiplied by
    `attention_factor`. With `partial_rotary_factor` < 1 only the first
    int(head_dim * factor) dimensions rotate (paired within them, in either layout)
    and the rest pass through; inv_freq then has half that length (rope_frequencies
    with the same factor).
    `rotated_part="last"` rotates the last int(head_dim * factor) dimensions instead.
    """
    _check_x(x)
    choice("layout", layout, LAYOUTS)
    choice("rotated_part", rotated_part, ROTATED_PARTS)
    rotated = rotary_dim(x.shape[-1], partial_rotary_factor)
    if rotated == x.shape[-1]:
        same_last_dim(
            "x", x, 2 * inv_freq.shape[-1], f"inv_freq of length {inv_freq.shape[-1]}"
        )
    else:
        same_last_dim(
            "inv_freq",
            inv_freq,
            rotated // 2,
            f"partial_rotary_factor={partial_rotary_factor} of head_dim {x.shape[-1]} "
            f"(rotating {rotated})",
        )
    positive_float("attention_factor", attention_factor)
    p = _broadcastable(as_positions("positions", positions, integer=False), x)
    cos, sin = rope_cos_sin(p, inv_freq, x, attention_factor)
    return rotate_pairs(x, cos, sin, layout, rotated_part)


@register
class Rope(Scheme):
    """Rotary position embedding applied to queries and keys (Su et al., RoFormer).

    `rope_type` and its parameters select a frequency schedule (see rope_frequencies);
    `numerics="transformers"` reproduces transformers' float32 frequencies bit for bit;
    `partial_rotary_factor` < 1 rotates only part of each head: the first dimensions, or
    with `rotated_part="last"` the last ones (DeepSeek's MLA heads, [nope | rope]).
    For positions 0..L-1 (what posenc.attention passes in the default layout) cos and
    sin come from a table kept per (length, device, dtype).
    """

    name = "rope"
    hook = "qk"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        layout: str = "half",
        rope_type: str = "default",
        numerics: str = "float64",
        rotated_part: str = "first",
        **rope_params,
    ):
        super().__init__()
        self.layout = choice("layout", layout, LAYOUTS)
        self.rotated_part = choice("rotated_part", rotated_part, ROTATED_PARTS)
        self.rope_type, self.numerics = rope_type, numerics
        self.rope_params = dict(rope_params)
        self.head_dim, self.base = head_dim, base
        inv_freq, self.attention_factor = self._frequencies()
        self.register_float32_buffer("inv_freq", inv_freq)

    def _frequencies(self, **seq_len) -> tuple[torch.Tensor, float]:
        args = (self.head_dim, self.base, self.rope_type, self.numerics)
        return rope_frequencies(*args, **self.rope_params, **seq_len)

    @property
    def follows_length(self) -> bool:
        """Dynamic NTK and LongRoPE without a fixed seq_len.

        Their frequencies follow the largest position seen in each call.
        """
        follows = self.rope_type in ("dynamic", "longrope")
        return follows and "seq_len" not in self.rope_params

    def frequencies_for(self, positions) -> torch.Tensor:
        """The inverse frequencies used for these positions.

        They depend on the positions only for dynamic NTK and LongRoPE.
        """
        if not self.follows_length:
            return self.inv_freq
        p = as_positions("positions", positions, integer=False)
        # the length seen so far; an empty chunk or positions below 0 (left padding)
        # are a length of 1, which grows nothing and keeps LongRoPE's short factors,
        # as in Hugging Face
        seq_len = max(int(p.max()) + 1, 1) if p.numel() else 1
        return self._frequencies(seq_len=seq_len)[0].to(self.inv_freq.device)

    def cos_sin(
        self, positions, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for these positions in like's dtype.

        They are sliced from a cached table when positions is a range. Frequencies that
        do not follow the length share one table per power of two, so decoding token by
        token builds a new one only when the length doubles (each entry is formed
        elementwise: a slice of a longer table is bit-identical). Dynamic NTK and
        LongRoPE take the frequencies of the range's length, one table per length.
        """
        same_last_dim("x", like, self.head_dim, f"Rope(head_dim={self.head_dim})")
        factor = self.attention_factor
        if isinstance(positions, range) and positions.step == 1:
            stop = positions.stop
            if not self.follows_length:
                stop = 1 << max(stop - 1, 0).bit_length()

            def table():
                with torch.no_grad():
                    frequencies = self.frequencies_for(range(stop))
                    return rope_cos_sin(torch.arange(stop), frequencies, like, factor)

            cos, sin = self.cached(("cos_sin", stop, like.device, like.dtype), table)
            kept = slice(positions.start, positions.stop)
            return cos[kept], sin[kept]
        p = as_positions("positions", positions, integer=False)
        return rope_cos_sin(
            _broadcastable(p, like), self.frequencies_for(p), like, factor
        )

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        _check_x(x)
        cos, sin = self.cos_sin(positions, x)
        return rotate_pairs(x, cos, sin, self.layout, self.rotated_part)

    def extra_repr(self) -> str:
        params = "".join(f", {k}={v}" for k, v in self.rope_params.items())
        numerics = "" if self.numerics == "float64" else f", numerics={self.numerics!r}"
        part = (
            ""
            if self.rotated_part == "first"
            else f", rotated_part={self.rotated_part!r}"
        )
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, layout={self.layout!r}, "
            f"rope_type={self.rope_type!r}{params}{numerics}{part}"
        )
