"""Rotary position embedding (Su et al., RoFormer): the query/key hook and its scheme.

`rope_frequencies` looks up a registry of frequency schedules keyed by the `rope_type`
names of Hugging Face transformers; `apply_rope` rotates queries or keys (with the
arithmetic of posenc.qk.rotation); `Rope` is the scheme, with a cos/sin table per
length, device and dtype.
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
from .rope_scaling import ROPE_TYPES, rope_parameters
from .rotation import (
    ROTATED_PARTS,
    _broadcastable,
    _check_x,
    rope_cos_sin,
    rotary_dim,
    rotate_pairs,
)

#: The two ways RoPE pairs a head's dimensions. ``"half"`` pairs i with i + head_dim/2
#: (GPT-NeoX, Hugging Face's rotate_half), ``"interleaved"`` pairs 2i with 2i + 1
#: (RoFormer, GPT-J); a permutation of the dimensions maps one to the other.
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
    truncates it (`ROPE_TYPES`, in posenc.qk.rope_scaling; parameters named as in
    Hugging Face's RoPE configs), like Hugging Face's RoPE init functions.

    `numerics="float64"` (the default) forms the frequencies in float64 and rounds once,
    so each is the float32 nearest the formula. `numerics="transformers"` forms them in
    float32 with transformers' operations, reproducing its `inv_freq` bit for bit: those
    differ by up to one float32 ulp for power-of-two head widths, and by several where
    2i/head_dim is itself rounded in float32 (up to 5 for head_dim 80 or 96 at bases
    up to 1e6), which at position 131071 moves an angle by up to about 1e-2 rad.
    Use it to run a checkpoint trained with transformers exactly as it was trained.

    Args:
        head_dim: the width of a head, even.
        base: b in theta_i = b^(-2i/d), > 1.
        rope_type: a key of `ROPE_TYPES` (``"default"``, ``"linear"``, ``"yarn"``...).
        numerics: ``"float64"`` or ``"transformers"``, as above.
        partial_rotary_factor: the fraction of each head that rotates, in (0, 1]
            (GPT-NeoX's rotary_pct): schedules are formed for the rotated width
            int(head_dim * factor), which changes the NTK exponent d/(d - 2) and YaRN's
            range, as in Hugging Face; "proportional" pairs the whole head instead.
        **params: the rope_type's parameters (``factor``,
            ``original_max_position_embeddings``, ``beta_fast``, ...).

    Returns:
        ``(inv_freq, attention_factor)``, inv_freq float32 of shape (rotated/2,) and
        the factor that multiplies cos and sin (1.0 but for YaRN and LongRoPE).

    Raises:
        ValueError: `rope_type` or `numerics` is unknown, a required parameter is
            missing, `base` <= 1, `head_dim` is odd, or a parameter is out of range.
        TypeError: the rope_type does not take one of `params`, or an argument is
            not a number.

    Example:
        >>> import torch, posenc
        >>> inv_freq, attention_factor = posenc.rope_frequencies(head_dim=8)
        >>> inv_freq.shape, inv_freq.dtype, attention_factor
        (torch.Size([4]), torch.float32, 1.0)
        >>> linear, _ = posenc.rope_frequencies(8, rope_type="linear", factor=4.0)
        >>> torch.testing.assert_close(linear, inv_freq / 4)
        >>> _, temperature = posenc.rope_frequencies(
        ...     8, rope_type="yarn", factor=4.0, original_max_position_embeddings=16
        ... )
        >>> round(temperature, 4)  # 0.1 ln 4 + 1
        1.1386
        >>> posenc.rope_frequencies(8, rope_type="linear")
        Traceback (most recent call last):
        ...
        ValueError: rope_type 'linear' needs factor
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

    Angles and their cos and sin are formed in float32 (float64 for float64 inputs),
    then cast to x's dtype, in which the rotation runs (posenc.qk.rotation).

    Args:
        x: queries or keys, (..., seq_len, head_dim), head_dim even.
        positions: (seq_len,), (batch, seq_len) for x of shape
            (batch, heads, seq_len, head_dim), or broadcastable to x.shape[:-1];
            integers, or real numbers for interpolated positions.
        inv_freq: the frequencies theta_i, (rotated/2,) (`rope_frequencies`).
        layout: ``"half"`` pairs dimension i with i + head_dim/2, ``"interleaved"``
            pairs 2i with 2i + 1 (`LAYOUTS`).
        attention_factor: multiplies cos and sin (YaRN's temperature).
        partial_rotary_factor: below 1, only the first int(head_dim * factor)
            dimensions rotate (paired within them, in either layout) and the rest pass
            through; inv_freq then has half that length (rope_frequencies with the
            same factor).
        rotated_part: ``"first"``, or ``"last"`` to rotate the last
            int(head_dim * factor) dimensions instead (DeepSeek's [nope | rope]).

    Returns:
        The rotated x, its shape broadcast with the positions', in x's dtype.

    Raises:
        ValueError: x is not (..., seq_len, head_dim) with head_dim even; inv_freq's
            length does not fit the rotated width; the positions do not broadcast;
            `layout` or `rotated_part` is unknown; `attention_factor` <= 0.
        TypeError: positions are not numbers (booleans, say).

    Example:
        >>> import torch, posenc
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k = torch.randn(2, 1, 2, 5, 8, generator=g)
        >>> inv_freq, _ = posenc.rope_frequencies(head_dim=8)
        >>> rq = posenc.apply_rope(q, torch.arange(5), inv_freq)
        >>> rk = posenc.apply_rope(k, torch.arange(5), inv_freq)
        >>> rq.shape
        torch.Size([1, 2, 5, 8])
        >>> torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))  # rotations
        >>> later = torch.arange(5) + 100  # the logits see only m - n
        >>> scores = posenc.apply_rope(q, later, inv_freq) @ posenc.apply_rope(
        ...     k, later, inv_freq
        ... ).mT
        >>> torch.testing.assert_close(scores, rq @ rk.mT)
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

    The query/key hook: `transform_qk` rotates queries and keys as `apply_rope` does,
    with the frequencies of `rope_frequencies`. For positions 0..L-1 (what
    posenc.attention passes in the default layout) cos and sin come from a table kept
    per (length, device, dtype). Registered as ``"rope"``.

    Args:
        head_dim: the width of a head, even.
        base: b in theta_i = b^(-2i/d).
        layout: ``"half"`` or ``"interleaved"`` (`LAYOUTS`).
        rope_type: the frequency schedule, a key of `ROPE_TYPES`.
        numerics: ``"transformers"`` reproduces transformers' float32 frequencies bit
            for bit; ``"float64"`` rounds the formula once.
        rotated_part: with ``partial_rotary_factor`` < 1, the ``"first"`` or the
            ``"last"`` dimensions of each head rotate (DeepSeek's MLA: [nope | rope]).
        **rope_params: the schedule's parameters as in Hugging Face's RoPE configs
            (``factor``, ``original_max_position_embeddings``, ...), and
            ``partial_rotary_factor``.

    Raises:
        ValueError: `layout`, `rotated_part`, `rope_type` or `numerics` is unknown,
            `head_dim` is odd, or a parameter is missing or out of range.
        TypeError: the schedule does not take one of `rope_params`, or an argument
            is not a number.

    Example:
        >>> import torch, posenc
        >>> rope = posenc.Rope(head_dim=8)
        >>> rope.hook, rope.inv_freq.shape
        ('qk', torch.Size([4]))
        >>> x = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0))
        >>> rotated = rope.transform_qk(x, torch.arange(5))
        >>> torch.testing.assert_close(
        ...     rotated, posenc.apply_rope(x, torch.arange(5), rope.inv_freq)
        ... )
        >>> posenc.Rope(8, rope_type="linear", factor=2.0)
        Rope(head_dim=8, base=10000, layout='half', rope_type='linear', factor=2.0)
        >>> mla = posenc.Rope(8, partial_rotary_factor=0.5, rotated_part="last")
        >>> torch.equal(mla.transform_qk(x, range(5))[..., :4], x[..., :4])
        True
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

        They depend on the positions only for dynamic NTK and LongRoPE (without a fixed
        ``seq_len``), whose frequencies follow the largest position plus one.

        Args:
            positions: a range, or a tensor or sequence of positions of any shape.

        Returns:
            The frequencies, float32 (rotated/2,); `inv_freq` for the other schedules.

        Raises:
            TypeError: positions are not numbers (for the schedules that read them).

        Example:
            >>> import torch, posenc
            >>> rope = posenc.Rope(
            ...     8, rope_type="dynamic", factor=2.0, max_position_embeddings=16
            ... )
            >>> torch.equal(rope.frequencies_for(range(16)), rope.inv_freq)
            True
            >>> longer = rope.frequencies_for(range(64))  # past 16: a larger base
            >>> bool((longer[1:] < rope.inv_freq[1:]).all())
            True
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

        Args:
            positions: a range (step 1), (seq_len,), or (batch, seq_len) for `like` of
                shape (batch, heads, seq_len, head_dim).
            like: a tensor (..., seq_len, head_dim) whose dtype and device they take.

        Returns:
            ``(cos, sin)``, each (..., seq_len, rotated/2) (the positions' shape, made
            to broadcast against like.shape[:-1]), times the attention factor.

        Raises:
            ValueError: like's last dimension is not `head_dim`, or the positions do
                not broadcast against it.

        Example:
            >>> import torch, posenc
            >>> rope = posenc.Rope(head_dim=8)
            >>> like = torch.zeros(1, 2, 5, 8, dtype=torch.bfloat16)
            >>> cos, sin = rope.cos_sin(range(5), like)
            >>> cos.shape, cos.dtype
            (torch.Size([5, 4]), torch.bfloat16)
            >>> torch.equal(cos, rope.cos_sin(torch.arange(5), like)[0])
            True
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
