"""ALiBi, attention with linear biases (Press et al., 2022): the score hook."""

from __future__ import annotations

import math

import torch

from ._checks import as_positions, positive_int


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The fixed (not learned) head slopes of the ALiBi paper, float32 of shape (num_heads,).

    For a power of two n the slopes are the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8).
    Otherwise the paper takes the n = 2^floor(log2 h) slopes of the nearest
    lower power of two and fills the remaining heads with every other slope of
    the sequence for 2n, so the extra heads interleave with the first ones.
    """
    positive_int("num_heads", num_heads)
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = _power_of_two_slopes(n)
    slopes += _power_of_two_slopes(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64).to(torch.float32)


def relative_distance(q_positions, k_positions) -> torch.Tensor:
    """Matrix of k_position - query_position, shape (len(q), len(k)), integer."""
    q = as_positions("q_positions", q_positions, integer=True)
    k = as_positions("k_positions", k_positions, integer=True).to(q.device)
    if q.ndim != 1 or k.ndim != 1:
        raise ValueError(f"q_positions and k_positions must be one-dimensional, got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    return k[None, :] - q[:, None]


def alibi_bias(slopes: torch.Tensor, q_positions, k_positions) -> torch.Tensor:
    """Additive logits bias -m_h * |i - j|, shape (num_heads, len(q), len(k)), float32.

    Under a causal mask (j <= i) this is the paper's -m_h (i - j). The absolute
    value extends it to keys after the query, as bidirectional uses of ALiBi do.
    """
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape (num_heads,), got {tuple(slopes.shape)}")
    distance = relative_distance(q_positions, k_positions).abs().to(torch.float32)
    return -slopes.to(device=distance.device, dtype=torch.float32)[:, None, None] * distance
