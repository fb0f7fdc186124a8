"""Sinusoidal absolute positions (Vaswani et al., 2017): the input hook."""

from __future__ import annotations

import torch

from ._checks import as_positions, positive_float, positive_int


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequency of every column: base ** (-2 * floor(c / 2) / dim), in float64.

    Columns 2i and 2i + 1 share one frequency; the exponent uses the pair index i,
    not the column index c (a common slip).
    """
    positive_int("dim", dim)
    positive_float("base", base, minimum=1.0)
    pair = torch.arange(dim, dtype=torch.float64).div(2, rounding_mode="floor")
    return base ** (-2.0 * pair / dim)


def sinusoidal_encoding(positions, dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The table of Vaswani et al.: PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(same).

    Sines and cosines are interleaved (even columns sin, odd columns cos). The
    angles are formed in float64, so the table agrees with the formula to about
    1e-7 even at position 10^5, then cast to `dtype`. Returns a tensor of shape
    `positions.shape + (dim,)`. Positions may be integers or real numbers.
    """
    p = as_positions("positions", positions, integer=False).to(torch.float64)
    freq = sinusoidal_frequencies(dim, base).to(p.device)
    angles = p[..., None] * freq
    columns = torch.arange(dim, device=p.device)
    table = torch.where(columns % 2 == 0, torch.sin(angles), torch.cos(angles))
    return table.to(dtype)


def sinusoidal_wavelengths(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Wavelength in positions of each sin/cos pair: 2 pi base^(2i/dim), from 2 pi to about 2 pi base."""
    return 2 * torch.pi / sinusoidal_frequencies(dim, base)[::2]


def shift_rotation(k: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed (dim, dim) block-diagonal matrix M_k with PE[p + k] = M_k @ PE[p] for every p.

    Each 2x2 block [[cos w k, sin w k], [-sin w k, cos w k]] rotates one
    (sin, cos) pair; it depends on the shift k and not on p, which is why the
    authors hoped a linear layer could attend by relative position.
    """
    dim = positive_int("dim", dim, even=True)
    w = sinusoidal_frequencies(dim, base)[::2] * float(k)
    c, s = torch.cos(w), torch.sin(w)
    m = torch.zeros(dim, dim, dtype=torch.float64)
    i = torch.arange(0, dim, 2)
    m[i, i], m[i, i + 1] = c, s
    m[i + 1, i], m[i + 1, i + 1] = -s, c
    return m
