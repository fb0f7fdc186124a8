"""T5's relative position bias (Raffel et al., 2020).

One learned scalar per (bucket of distance, head).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import as_positions, positive_float, positive_int
from ..scheme import Scheme, register


def t5_relative_bucket(
    relative_position,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket of each relative position (key_position - query_position).

    The same buckets as Hugging Face's T5Attention._relative_position_bucket.

    Half the buckets of a direction hold the distances 0, 1, 2, ... exactly; the
    other half cover the distances up to `max_distance` on a log scale, and every
    distance beyond it shares the last bucket. `bidirectional=True` (encoder)
    gives keys after the query their own half of the buckets; `False` (decoder)
    maps every key after the query to bucket 0 with distance 0.

    Args:
        relative_position: key_position - query_position, integers of any shape.
        bidirectional: encoder (True) or decoder (False) buckets.
        num_buckets: the buckets in all (both directions when bidirectional: then
            even).
        max_distance: the distance from which on every key shares the last bucket.

    Returns:
        The buckets, int64, of the shape of `relative_position`, in
        [0, num_buckets).

    Raises:
        TypeError: `relative_position` is not integers, or `num_buckets` or
            `max_distance` not an integer.
        ValueError: `num_buckets` is odd (bidirectional) or leaves no exact bucket,
            or `max_distance` does not exceed the exact buckets.

    Example:
        >>> import torch, posenc
        >>> distances = torch.tensor([-200, -20, -3, 0, 3, 20, 200])
        >>> posenc.t5_relative_bucket(distances).tolist()
        [15, 10, 3, 0, 19, 26, 31]
        >>> posenc.t5_relative_bucket(distances, bidirectional=False).tolist()
        [31, 17, 3, 0, 0, 0, 0]
    """
    split = "bidirectional buckets are split between keys before and after the query"
    positive_int("num_buckets", num_buckets, even=split if bidirectional else None)
    positive_int("max_distance", max_distance)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    if max_exact < 1:
        raise ValueError(
            f"num_buckets must be at least {4 if bidirectional else 2} "
            f"(bidirectional={bidirectional}), got {num_buckets}"
        )
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must exceed the {max_exact} exact buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}), "
            f"got {max_distance}"
        )
    rel = as_positions("relative_position", relative_position, integer=True).long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        buckets = buckets + (rel > 0).long() * per_direction
        distance = rel.abs()
    else:
        distance = (-rel).clamp(min=0)
    is_small = distance < max_exact
    # float32 on purpose: the same rounding as the reference, so that every input gets
    # the same bucket
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(
        max_distance / max_exact
    )
    large = (max_exact + (log_ratio * (per_direction - max_exact)).long()).clamp(
        max=per_direction - 1
    )
    return buckets + torch.where(is_small, distance, large)


@register
class T5Bias(Scheme):
    """One learned scalar per (bucket of relative position, head), added to the logits.

    Raffel et al. (2020). The bucket of every distance up to `max_distance` is computed
    once (`buckets`; every distance beyond shares its direction's last bucket), and the
    kernel reads it: no (L, L) table is built on the fast path (compiled
    FlexAttention), and no logarithm is taken per score. T5 computes
    the bias once, in the first layer, and every layer reuses it. T5 also drops the
    1 / sqrt(head_dim) scaling (pass scale=1.0 to posenc.attention to match a T5
    checkpoint).

    Registered as ``"t5"``.

    Args:
        num_heads: the number of heads, one learned scalar per bucket each.
        num_buckets: the buckets (split between the two directions when
            bidirectional: then even).
        max_distance: the distance past which every key shares its direction's
            last bucket.
        bidirectional: True for an encoder (keys after the query have buckets of
            their own), False for a decoder.
        init_std: the standard deviation of the table's normal initialisation.

    Raises:
        TypeError: `num_heads`, `num_buckets` or `max_distance` is not an integer.
        ValueError: `num_buckets` is odd (bidirectional) or too small for one exact
            bucket, `max_distance` does not exceed the exact buckets, or `init_std`
            <= 0.

    Example:
        >>> import torch, posenc
        >>> t5 = posenc.T5Bias(num_heads=4)
        >>> t5.hook, t5.table.shape  # (num_buckets, num_heads), learned
        ('score', torch.Size([32, 4]))
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 4, 6, 8, generator=g)
        >>> out = posenc.attention(q, k, v, t5, scale=1.0)  # T5 drops 1/sqrt(head_dim)
        >>> sdpa = posenc.attention(q, k, v, t5, scale=1.0, backend="sdpa")
        >>> torch.testing.assert_close(sdpa, out)
    """

    name = "t5"
    hook = "score"
    bias_is_constant = False

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        init_std: float = 0.02,
    ):
        super().__init__()
        self.num_heads = positive_int("num_heads", num_heads)
        # checks the arguments
        zero = torch.zeros(1, dtype=torch.long)
        t5_relative_bucket(zero, bidirectional, num_buckets, max_distance)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.table = nn.Parameter(
            torch.randn(num_buckets, num_heads) * positive_float("init_std", init_std)
        )
        # the bucket of k - q for k - q = -max_distance .. max_distance, computed once
        near = torch.arange(-max_distance, max_distance + 1)
        buckets = t5_relative_bucket(near, bidirectional, num_buckets, max_distance)
        self.register_buffer("buckets", buckets, persistent=False)

    @property
    def score_mod(self):
        """score + the bias of the distance's bucket and the head, as a score_mod.

        The bias of every distance from -max_distance to max_distance is gathered from
        the learned table once per call (a (2 max_distance + 1, heads) table, which
        follows the table's gradient), so the kernel reads one entry per score;
        distances beyond share their direction's last bucket.
        """
        by_distance, limit = self.table[self.buckets], self.max_distance

        def t5_bias(score, b, h, q_pos, k_pos):
            near = (k_pos - q_pos).clamp(-limit, limit)
            return score + by_distance[near + limit, h]

        return t5_bias

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
