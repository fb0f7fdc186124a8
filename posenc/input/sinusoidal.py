"""Sinusoidal absolute positions (Vaswani et al., 2017): the input hook, its math and
its scheme."""

from __future__ import annotations

import torch

from .._checks import PAIRS, as_positions, positive_float, positive_int
from ..scheme import Scheme, register


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequency of every column: base ** (-2 * floor(c / 2) / dim), in
    float64.

    Columns 2n and 2n + 1 share one frequency; the exponent uses the pair index n,
    not the column index c (a common slip).
    """
    positive_int("dim", dim)
    positive_float("base", base, minimum=1.0)
    pair = torch.arange(dim, dtype=torch.float64).div(2, rounding_mode="floor")
    return base ** (-2.0 * pair / dim)


def sinusoidal_encoding(
    positions, dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The table of Vaswani et al.: PE[p, 2n] = sin(p / base^(2n/dim)),
    PE[p, 2n+1] = cos(same), for the position p and the pair n.

    Sines and cosines are interleaved (even columns sin, odd columns cos). The
    angles are formed in float64, so the table agrees with the formula to about
    1e-7 even at position 10^5, then cast to `dtype`.

    Args:
        positions: positions of any shape, (seq_len,) or (batch, seq_len), integers
            or real numbers.
        dim: the width of the code (the model width).
        base: the wavelengths run from 2 pi to 2 pi base; > 1.
        dtype: the dtype of the table.

    Returns:
        A tensor of shape positions.shape + (dim,), in `dtype`.

    Raises:
        TypeError: positions are not real numbers, or `dim` is not an integer.
        ValueError: `dim` < 1, `base` <= 1, or a position is not finite.

    Example:
        >>> import torch, posenc
        >>> pe = posenc.sinusoidal_encoding(torch.arange(4), dim=6)
        >>> pe.shape, pe.dtype
        (torch.Size([4, 6]), torch.float32)
        >>> pe[0].tolist()  # sin 0, cos 0 in every pair
        [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
        >>> torch.testing.assert_close(pe[:, 0], torch.sin(torch.arange(4.0)))
        >>> posenc.sinusoidal_encoding(torch.zeros(2, 3, dtype=torch.long), 6).shape
        torch.Size([2, 3, 6])
    """
    angles = sinusoidal_angles(positions, dim, base, torch.float64)
    columns = torch.arange(dim, device=angles.device)
    table = torch.where(columns % 2 == 0, torch.sin(angles), torch.cos(angles))
    return table.to(dtype)


def sinusoidal_wavelengths(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Wavelength in positions of each sin/cos pair: 2 pi base^(2n/dim), from 2 pi to
    about 2 pi base."""
    return 2 * torch.pi / sinusoidal_frequencies(dim, base)[::2]


def shift_rotation(k: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed (dim, dim) block-diagonal matrix M_k with PE[p + k] = M_k @ PE[p]
    for every p.

    Each 2x2 block [[cos w k, sin w k], [-sin w k, cos w k]] rotates one
    (sin, cos) pair; it depends on the shift k and not on p, which is why the
    authors hoped a linear layer could attend by relative position.
    """
    dim = positive_int("dim", dim, even=PAIRS)
    w = sinusoidal_frequencies(dim, base)[::2] * float(k)
    c, s = torch.cos(w), torch.sin(w)
    m = torch.zeros(dim, dim, dtype=torch.float64)
    i = torch.arange(0, dim, 2)
    m[i, i], m[i, i + 1] = c, s
    m[i + 1, i], m[i + 1, i + 1] = -s, c
    return m


def sinusoidal_angles(
    positions, dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Angles p * omega_c of every column c, of shape positions.shape + (dim,),
    formed in `dtype`.

    sinusoidal_encoding forms these angles in float64 (the default here). Other
    dtypes are here to show what goes wrong: in float32 an angle near 10^5 is
    rounded to a multiple of 2^-7, so its sine and cosine can be off by
    several times 10^-3.
    """
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"dtype must be a floating-point torch dtype, got {dtype}")
    p = as_positions("positions", positions, integer=False)
    freq = sinusoidal_frequencies(dim, base)
    return p.to(dtype)[..., None] * freq.to(device=p.device, dtype=dtype)


def input_logit_terms(
    content: torch.Tensor,
    code: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    scale: float | None = None,
) -> dict[str, torch.Tensor]:
    """The four terms of the attention logit when a positional code is added to the
    input.

    With x_i = e_i + p_i (content e and code p, both (seq_len, dim)) and
    projections w_q, w_k of shape (dim, head_dim), the logit
    scale * (x_i w_q) . (x_j w_k) is the sum of four (seq_len, seq_len) terms,
    returned in float64 under the keys "content-content" (e_i, e_j),
    "content-position" (e_i, p_j), "position-content" (p_i, e_j) and
    "position-position" (p_i, p_j). scale defaults to 1 / sqrt(head_dim).
    """
    for name, t in (("content", content), ("code", code), ("w_q", w_q), ("w_k", w_k)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D tensor, got {got}")
    if content.shape != code.shape:
        raise ValueError(
            f"content {tuple(content.shape)} and code {tuple(code.shape)} "
            "must have the same shape (seq_len, dim)"
        )
    if w_q.shape != w_k.shape or w_q.shape[0] != content.shape[1]:
        raise ValueError(
            f"w_q {tuple(w_q.shape)} and w_k {tuple(w_k.shape)} must both be "
            f"(dim, head_dim) with dim = {content.shape[1]}"
        )
    scale = (
        1.0 / w_q.shape[1] ** 0.5 if scale is None else positive_float("scale", scale)
    )
    dev = content.device
    a = (w_q.double().to(dev) @ w_k.double().to(dev).T) * scale
    e, p = content.double(), code.double().to(dev)
    return {
        "content-content": e @ a @ e.T,
        "content-position": e @ a @ p.T,
        "position-content": p @ a @ e.T,
        "position-position": p @ a @ p.T,
    }


@register
class Sinusoidal(Scheme):
    """Fixed sin/cos table added to the token embeddings (Vaswani et al., 2017).

    The input hook: `embed` returns `sinusoidal_encoding(positions, dim, base)`,
    which a model adds to its token embeddings (posenc.TinyTransformer does);
    attention itself is unchanged. Nothing is learned. Registered as
    ``"sinusoidal"``.

    Args:
        dim: the width of the code, the model width.
        base: the wavelengths run from 2 pi to 2 pi base; > 1.

    Raises:
        TypeError: `dim` is not an integer or `base` not a number.
        ValueError: `dim` < 1 or `base` <= 1.

    Example:
        >>> import torch, posenc
        >>> sinusoidal = posenc.Sinusoidal(dim=16)
        >>> sinusoidal.hook, list(sinusoidal.parameters())
        ('input', [])
        >>> codes = sinusoidal.embed(torch.arange(10))
        >>> codes.shape
        torch.Size([10, 16])
        >>> torch.equal(codes, posenc.sinusoidal_encoding(torch.arange(10), 16))
        True
    """

    name = "sinusoidal"
    hook = "input"

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.dim = positive_int("dim", dim)
        self.base = positive_float("base", base, minimum=1.0)

    def embed(self, positions) -> torch.Tensor:
        return sinusoidal_encoding(positions, self.dim, self.base)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}"
