"""ALiBi, attention with linear biases (Press et al., 2022): a score hook with fixed
slopes."""

from __future__ import annotations

import math

import torch

from .._checks import positive_int
from ..scheme import Scheme, register


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The fixed (not learned) head slopes of the ALiBi paper.

    For a power of two n the slopes are the geometric sequence 2^(-8/n), 2^(-16/n),
    ..., 2^(-8). Otherwise the authors' reference code takes the n = 2^floor(log2
    num_heads) slopes of the nearest lower power of two and fills the remaining heads
    with every other slope of the sequence for 2n, so the extra heads interleave with
    the first ones. BLOOM and MPT (with its default alibi_bias_max = 8) use the same
    rule.

    Args:
        num_heads: the number of heads, one slope each.

    Returns:
        The slopes m_h, float32 of shape (num_heads,).

    Raises:
        TypeError: `num_heads` is not an integer.
        ValueError: `num_heads` < 1.

    Example:
        >>> import posenc
        >>> posenc.alibi_slopes(8).tolist()  # 2^-1 ... 2^-8
        [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
        >>> posenc.alibi_slopes(6).tolist()  # the 4 of n = 4, then 2 of n = 8's odd
        [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    """
    positive_int("num_heads", num_heads)
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = _power_of_two_slopes(n)
    slopes += _power_of_two_slopes(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64).to(torch.float32)


@register
class ALiBi(Scheme):
    """Linear distance penalty `-m_h |i - j|` on the logits, one fixed slope per head
    (Press et al., 2022).

    Under a causal mask (j <= i) this is the paper's -m_h (i - j); the absolute value
    extends it to keys after the query, as bidirectional uses of ALiBi do. The bias is
    one `score_mod`, which every backend runs (FlexAttention inside its kernel); the
    slopes are a buffer, not parameters. Registered as ``"alibi"``.

    Args:
        num_heads: the number of heads; head h has slope ``alibi_slopes(num_heads)[h]``.

    Raises:
        TypeError: `num_heads` is not an integer.
        ValueError: `num_heads` < 1.

    Example:
        >>> import torch, posenc
        >>> alibi = posenc.ALiBi(num_heads=4)
        >>> alibi.hook, alibi.slopes.tolist()
        ('score', [0.25, 0.0625, 0.015625, 0.00390625])
        >>> q_pos, k_pos = torch.arange(4)[:, None], torch.arange(4)[None, :]
        >>> bias = alibi.score_mod(torch.zeros(()), 0, 1, q_pos, k_pos)  # head 1
        >>> bias[3].tolist()  # query 3 against keys 0..3
        [-0.1875, -0.125, -0.0625, 0.0]
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 4, 6, 8, generator=g)
        >>> out = posenc.attention(q, k, v, alibi)
        >>> sdpa = posenc.attention(q, k, v, alibi, backend="sdpa")
        >>> torch.testing.assert_close(sdpa, out)
    """

    name = "alibi"
    hook = "score"

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = positive_int("num_heads", num_heads)
        self.register_float32_buffer("slopes", alibi_slopes(num_heads))

    def score_mod(self, score, b, h, q_pos, k_pos):
        return score - self.slopes[h] * (q_pos - k_pos).abs()

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
