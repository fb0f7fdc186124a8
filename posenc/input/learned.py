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
