"""xPos (Sun et al., 2022): RoPE whose rotation also scales, so logits decay.

Pair i of a query at position m is rotated by m theta_i and multiplied by
zeta_i^(m / scale_base); pair i of a key at position n is rotated by n theta_i and
multiplied by the inverse factor zeta_i^(-n / scale_base) (torchscale's `downscale`),
with zeta_i = (2i / d + gamma) / (1 + gamma) < 1: at positions > 0 queries shrink and
keys grow.
In their dot product the factors meet as zeta_i^((m - n) / scale_base): the logit still
depends on m - n only (RoPE's relative property), and for a query after its key
(m > n, a causal decoder) every pair is damped more the farther apart they are,
the fastest-turning pairs (small i, small zeta_i) most.
"""

from __future__ import annotations

import math

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
from .rope import LAYOUTS, rope_frequencies
from .rotation import _angle_dtype, _broadcastable, _check_x, rope_angles, rotate_pairs


def xpos_zeta(head_dim: int, gamma: float = 0.4) -> torch.Tensor:
    """zeta_i = (2i / head_dim + gamma) / (1 + gamma) for i < head_dim / 2, in float64.

    With gamma = 0.4 this is torchscale's (2i + 0.4 d) / (1.4 d).
    """
    positive_int("head_dim", head_dim, even=PAIRS)
    gamma = positive_float("gamma", gamma)
    return (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim + gamma) / (
        1 + gamma
    )


@register
class XPos(Scheme):
    """xPos as a query/key scheme: RoPE times zeta^(position / scale_base).

    The scale is inverted for keys (`transform_k`), so a logit is RoPE's times
    zeta_i^((m - n) / scale_base) per pair, a function of m - n only.
    Only a query after its key is damped (m > n); for a key after its query the same
    factor grows, so xPos is meant for causal attention, as in the paper. The scales
    are exp((n / scale_base) ln zeta_i), formed with the angles in float32 (float64 for
    float64 inputs); a key far from 0 gets a huge factor and its query a tiny one, so
    positions are checked against the range of the dtype: shift queries and keys by
    the same offset to stay inside it (the logits depend only on the difference).
    Registered as ``"xpos"``.

    Args:
        head_dim: the width of a head, even.
        base: RoPE's base.
        scale_base: positions per power of zeta (torchscale's 512).
        gamma: zeta_i = (2i / head_dim + gamma) / (1 + gamma).
        layout: ``"half"`` or ``"interleaved"`` (`LAYOUTS`).

    Raises:
        ValueError: `head_dim` is odd, `layout` is unknown, `scale_base` or `gamma`
            is not positive; on use, positions so far from 0 that a scale leaves the
            dtype's range.
        TypeError: `head_dim` is not an integer, or another argument not a number.

    Example:
        >>> import torch, posenc
        >>> xpos = posenc.XPos(head_dim=8)
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k = torch.randn(2, 1, 1, 4, 8, generator=g)
        >>> def logits(p):
        ...     return xpos.transform_qk(q, p) @ xpos.transform_k(k, p).mT
        >>> near, far = torch.arange(4), torch.arange(4) + 100
        >>> torch.testing.assert_close(logits(far), logits(near))  # only m - n counts
        >>> xpos.transform_qk(q, near + 100_000)
        Traceback (most recent call last):
        ...
        ValueError: positions up to 100003 are too far from 0 for xPos in ...
    """

    name = "xpos"
    hook = "qk"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        layout: str = "half",
    ):
        super().__init__()
        self.layout = choice("layout", layout, LAYOUTS)
        self.head_dim, self.base = head_dim, base
        self.scale_base, self.gamma = (
            positive_float("scale_base", scale_base),
            positive_float("gamma", gamma),
        )
        self.register_float32_buffer("inv_freq", rope_frequencies(head_dim, base)[0])
        self.register_float32_buffer("log_zeta", xpos_zeta(head_dim, gamma).log())

    def _check_range(self, p: torch.Tensor, dtype: torch.dtype) -> None:
        info = torch.finfo(dtype)
        # 2.0: headroom for the products that follow
        limit = min(math.log(info.max), -math.log(info.tiny)) - 2.0
        largest = float(p.abs().max()) if p.numel() else 0.0
        steepest = -float(self.log_zeta[0])
        if largest * steepest / self.scale_base > limit:
            allowed = int(limit * self.scale_base / steepest)
            raise ValueError(
                f"positions up to {largest:g} are too far from 0 for xPos in {dtype}: "
                f"zeta_0^(n / scale_base) leaves its range past |n| = {allowed}; "
                "shift q and k positions by the same offset (the logits depend only "
                "on their difference) or use a larger scale_base"
            )

    def scaled_cos_sin(
        self, positions, like: torch.Tensor, sign: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the RoPE angles times zeta^(sign * position / scale_base).

        In like's dtype.
        """
        same_last_dim("x", like, self.head_dim, f"XPos(head_dim={self.head_dim})")
        p = (
            torch.arange(positions.start, positions.stop)
            if isinstance(positions, range)
            else as_positions("positions", positions, integer=False)
        )
        p = _broadcastable(p.to(like.device), like)
        dtype = _angle_dtype(like, self.inv_freq)
        # the scales end in like.dtype, the narrowest range on the way
        self._check_range(p, like.dtype)
        angles = rope_angles(p, self.inv_freq.to(like.device), dtype)
        scale = torch.exp(
            sign
            * p.to(dtype)[..., None]
            / self.scale_base
            * self.log_zeta.to(device=like.device, dtype=dtype)
        )
        return (angles.cos() * scale).to(like.dtype), (angles.sin() * scale).to(
            like.dtype
        )

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        """Queries: rotated and scaled by zeta^(m / scale_base)."""
        _check_x(x)
        return rotate_pairs(x, *self.scaled_cos_sin(positions, x, 1.0), self.layout)

    def transform_k(self, x: torch.Tensor, positions) -> torch.Tensor:
        """Keys: rotated and scaled by zeta^(-n / scale_base)."""
        _check_x(x)
        return rotate_pairs(x, *self.scaled_cos_sin(positions, x, -1.0), self.layout)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, "
            f"scale_base={self.scale_base:g}, gamma={self.gamma:g}, "
            f"layout={self.layout!r}"
        )
