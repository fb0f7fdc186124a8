"""Learned absolute positions: a trained table and a learned recurrence.

The table is BERT's and GPT-2's; the recurrence is a FLOATER-style sketch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import as_positions, positive_float, positive_int
from ..scheme import Scheme, register


@register
class LearnedAbsolute(Scheme):
    """A trainable (max_len, dim) table added to the token embeddings (BERT, GPT-2).

    It has a row for each position seen in training and nothing beyond: a
    position >= max_len is an error, not a silent index wrap (nor, on a GPU,
    a device-side assert). The check reads the positions' smallest and largest
    values on the host, which on a GPU costs a synchronisation per call.
    Registered as ``"learned"``.

    Args:
        max_len: the rows of the table, for the positions 0..max_len-1.
        dim: the width of a code, the model width.
        init_std: the standard deviation of the table's normal initialisation.

    Raises:
        TypeError: `max_len` or `dim` is not an integer; on use, positions that are
            not integers.
        ValueError: `max_len` or `dim` < 1, or `init_std` <= 0; on use, a position
            outside [0, max_len).

    Example:
        >>> import torch, posenc
        >>> learned = posenc.LearnedAbsolute(max_len=16, dim=8)
        >>> learned.hook, learned.table.shape
        ('input', torch.Size([16, 8]))
        >>> learned.embed(torch.arange(10)).shape
        torch.Size([10, 8])
        >>> torch.equal(learned.embed(torch.tensor([3])), learned.table[3:4])
        True
        >>> learned.embed(torch.arange(17))
        Traceback (most recent call last):
        ...
        ValueError: position 16 is outside the learned table: ...
    """

    name = "learned"
    hook = "input"

    def __init__(self, max_len: int, dim: int, init_std: float = 0.02):
        super().__init__()
        self.max_len, self.dim = (
            positive_int("max_len", max_len),
            positive_int("dim", dim),
        )
        self.table = nn.Parameter(
            torch.randn(max_len, dim) * positive_float("init_std", init_std)
        )

    def embed(self, positions) -> torch.Tensor:
        p = as_positions("positions", positions, integer=True).to(self.table.device)
        if p.numel() and (int(p.min()) < 0 or int(p.max()) >= self.max_len):
            bad = int(p.max()) if int(p.max()) >= self.max_len else int(p.min())
            raise ValueError(
                f"position {bad} is outside the learned table: positions must be in "
                f"[0, max_len={self.max_len}); a learned table has no row past max_len"
            )
        return self.table[p]

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}"


@register
class RecurrentAbsolute(Scheme):
    """Positions from a learned recurrence: p_0 = s, p_{t+1} = p_t + tanh(W p_t + b).

    One Euler step per position of a learned dynamical system, in the spirit of
    FLOATER (Liu et al., 2020). It is defined at every position, so it can run
    past the training length, but computing position t takes t sequential steps.
    `init_std` scales the start s; W is drawn with std 0.5 / sqrt(dim). A model
    that re-initialises its linear layers (TinyTransformer does) replaces W's draw.
    Registered as ``"recurrent"``.

    Args:
        dim: the width of a code, the model width.
        init_std: the standard deviation of the start s.

    Raises:
        TypeError: `dim` is not an integer; on use, positions that are not integers.
        ValueError: `dim` < 1 or `init_std` <= 0; on use, a negative position.

    Example:
        >>> import torch, posenc
        >>> recurrent = posenc.RecurrentAbsolute(dim=8)
        >>> codes = recurrent.embed(torch.arange(5))
        >>> codes.shape, torch.equal(codes[0], recurrent.start)
        (torch.Size([5, 8]), True)
        >>> with torch.no_grad():
        ...     step = codes[0] + torch.tanh(recurrent.step(codes[0]))
        >>> torch.testing.assert_close(codes[1], step)
        >>> recurrent.embed(torch.tensor([1000])).shape  # any position: 1000 steps
        torch.Size([1, 8])
    """

    name = "recurrent"
    hook = "input"

    def __init__(self, dim: int, init_std: float = 0.02):
        super().__init__()
        self.dim = positive_int("dim", dim)
        self.start = nn.Parameter(
            torch.randn(dim) * positive_float("init_std", init_std)
        )
        self.step = nn.Linear(dim, dim)
        # small weights; the codes' norm still grows with t
        nn.init.normal_(self.step.weight, std=0.5 / math.sqrt(dim))
        nn.init.zeros_(self.step.bias)

    def embed(self, positions) -> torch.Tensor:
        p = as_positions("positions", positions, integer=True).to(self.start.device)
        if p.numel() and int(p.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(p.min())}")
        codes = [self.start]
        for _ in range(int(p.max()) if p.numel() else 0):
            codes.append(codes[-1] + torch.tanh(self.step(codes[-1])))
        return torch.stack(codes)[p]

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
