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
    """The fixed (not learned) head slopes of the ALiBi paper, float32 of shape
    (num_heads,).

    For a power of two n the slopes are the geometric sequence 2^(-8/n), 2^(-16/n),
    ..., 2^(-8). Otherwise the authors' reference code takes the n = 2^floor(log2
    num_heads) slopes of the nearest lower power of two and fills the remaining heads
    with every other slope of the sequence for 2n, so the extra heads interleave with
    the first ones. BLOOM and MPT (with its default alibi_bias_max = 8) use the same
    rule.
    """
    positive_int("num_heads", num_heads)
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = _power_of_two_slopes(n)
    slopes += _power_of_two_slopes(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64).to(torch.float32)


@register
class ALiBi(Scheme):
    """Linear distance penalty -m_h |i - j| on the logits, one fixed slope per head
    (Press et al., 2022).

    Under a causal mask (j <= i) this is the paper's -m_h (i - j); the absolute value
    extends it to keys after the query, as bidirectional uses of ALiBi do.
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
