"""The three desiderata, measured the same way for every scheme.

Whatever the hook, a scheme is judged by the logits it produces when content
carries no information: every token is the same content vector u, so any
structure in the (heads, L, L) logits comes from position alone. From these
"position logits" we measure

1. distinct codes: do two different positions give different rows of logits?
2. similarity that falls with distance: the mean logit against the offset
   r = i - j of a key before its query;
3. behaviour past the training length: does a query at a new position see the
   same logits over its last `train_len` keys as a training query did, and how
   much attention does it put on keys farther away than anything in training?

Two conventions shape the numbers. The norm of u is fixed at sqrt(dim / 2): the
logits of an input or query/key scheme grow with it, a bias does not, so the
attention weights (`far_attention`) depend on it. And `decay_score` orders a
curve: 0.5 means "no trend" only for a constant curve (NoPE).
"""

from __future__ import annotations

import math

import torch

from ._checks import positive_float, positive_int
from .core import attention_logits
from .scheme import Scheme
from .score.masks import mask_matrix


def content_vector(dim: int, seed: int = 0) -> torch.Tensor:
    """A fixed random content vector of norm sqrt(dim / 2), the norm of a sinusoidal
    code."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(dim, generator=gen, dtype=torch.float64)
    return (u / u.norm() * math.sqrt(dim / 2)).to(torch.float32)


def _width(scheme: Scheme, dim: int | None, num_heads: int | None) -> tuple[int, int]:
    """The content width and head count a scheme fixes (its dim or head_dim, its
    heads), else the defaults."""
    # a sliding window takes its sizes from the scheme it wraps
    inner = getattr(scheme, "inner", None)
    own_dim = (
        getattr(scheme, "dim", None)
        or getattr(scheme, "head_dim", None)
        or getattr(inner, "dim", None)
        or getattr(inner, "head_dim", None)
    )
    own_heads = getattr(scheme, "num_heads", None) or getattr(inner, "num_heads", None)
    for name, given, own in (
        ("dim", dim, own_dim),
        ("num_heads", num_heads, own_heads),
    ):
        if given is not None and own is not None and given != own:
            raise ValueError(f"{name}={given} does not match the scheme's {name} {own}")
    dim = positive_int("dim", dim or own_dim or 64)
    return dim, positive_int("num_heads", num_heads or own_heads or 1)


@torch.no_grad()
def position_logits(
    scheme: Scheme,
    num_positions: int,
    dim: int | None = None,
    num_heads: int | None = None,
    seed: int = 0,
    content_scale: float = 1.0,
) -> torch.Tensor:
    """(num_heads, L, L) logits between positions 0..L-1 when every token has the
    same content.

    Input-hook schemes add their code to the content (x_i = u + p_i); query/key
    schemes transform u at each position; score schemes add their bias. No
    projections, no mask: the full matrix, so both directions can be inspected.
    The width and head count default to the scheme's own (64 and 1 where it has
    none). `content_scale` multiplies u (norm content_scale * sqrt(dim / 2)): a
    query/key scheme's logits grow with its square, a bias stays as it is.
    """
    positive_int("num_positions", num_positions)
    positive_float("content_scale", content_scale)
    dim, num_heads = _width(scheme, dim, num_heads)
    positions = torch.arange(num_positions)
    u = content_vector(dim, seed) * content_scale
    x = u.expand(num_positions, dim)
    code = scheme.embed(positions)
    if code is not None:
        x = x + code.to(device=x.device, dtype=x.dtype)
    x = x.expand(1, num_heads, num_positions, dim)
    scale = 1.0 / math.sqrt(dim)
    return attention_logits(x, x, scheme, positions, positions, scale)[0]


@torch.no_grad()
def distinctness(logits: torch.Tensor) -> float:
    """Smallest RMS difference between the logit rows of two different query positions.

    Zero means two positions are indistinguishable to attention (NoPE, or a
    code that repeats); larger is more distinct. logits is (heads, L, L).
    """
    rows = logits.permute(1, 0, 2).reshape(logits.shape[1], -1).double()
    gaps = torch.cdist(rows, rows) / math.sqrt(rows.shape[1])
    gaps.fill_diagonal_(float("inf"))
    return float(gaps.min())


@torch.no_grad()
def diagonal_spread(matrix: torch.Tensor, causal: bool = False) -> float:
    """Largest max - min along any diagonal j - i = const of a (..., n, n) matrix
    (only j <= i if causal).

    Zero exactly when matrix[i, j] depends on j - i alone: the test of a relative
    scheme.
    """
    n = matrix.shape[-1]
    diagonals = (matrix.diagonal(o, -2, -1) for o in range(-n + 1, 1 if causal else n))
    return max((d.max() - d.min()).item() for d in diagonals)


@torch.no_grad()
def similarity_by_distance(logits: torch.Tensor) -> torch.Tensor:
    """Mean logit between a query and the key `r` positions before it, for
    r = 0..L-1 (averaged over heads and over the queries i >= r)."""
    length = logits.shape[-1]
    return torch.stack(
        [
            logits.diagonal(offset=-r, dim1=-2, dim2=-1).double().mean()
            for r in range(length)
        ]
    ).float()


def decay_score(curve: torch.Tensor) -> float:
    """Fraction of distance pairs r1 < r2 with curve[r1] > curve[r2] (ties count
    half).

    1.0: similarity falls strictly with distance; 0.0: it rises; 0.5 for a constant
    curve (NoPE). Only there does 0.5 mean "no trend": the score orders a curve, so
    a trendless but noisy one (a random table) can score far from 0.5.
    """
    c = curve.double()
    upper = torch.triu(torch.ones(len(c), len(c), dtype=torch.bool), diagonal=1)
    diff = (c[:, None] - c[None, :])[upper]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


@torch.no_grad()
def window_drift(logits: torch.Tensor, train_len: int) -> float:
    """Largest relative change, for queries past `train_len`, of the logits over
    their last train_len keys.

    The reference is the last training query, which sees keys 0..train_len-1.
    Zero means a query at an unseen position sees exactly what a training query
    saw over the same distances (the promise of relative schemes).
    """
    positive_int("train_len", train_len)
    length = logits.shape[-1]
    if length <= train_len:
        raise ValueError(
            f"logits must cover more than train_len={train_len} positions, got {length}"
        )
    ref = logits[:, train_len - 1, :train_len].double()
    windows = (
        logits[:, i, i - train_len + 1 : i + 1].double()
        for i in range(train_len, length)
    )
    drift = [(window - ref).norm() / ref.norm() for window in windows]
    return float(torch.stack(drift).max())


@torch.no_grad()
def far_attention(
    logits: torch.Tensor, train_len: int, mask: torch.Tensor | None = None
) -> float:
    """Attention weight the last query puts on keys at distance >= train_len
    (causal, averaged over heads).

    Distances never seen in training; uniform attention would put
    (L - train_len) / L there. `mask` (L, L), True where a query may attend
    (a scheme's mask_mod as a matrix, e.g. a sliding window), restricts the
    softmax. A softmax weight depends on the logits' scale, so on the norm of the
    probe's content vector wherever the logits do (see `position_logits`).
    """
    positive_int("train_len", train_len)
    row = logits[:, -1, :].double()
    if mask is not None:
        row = row.masked_fill(~mask[-1].to(row.device), float("-inf"))
    row = row.softmax(dim=-1)
    distance = torch.arange(logits.shape[-1] - 1, -1, -1)
    return float(row[:, distance >= train_len].sum(dim=-1).mean())


@torch.no_grad()
def desiderata(
    scheme: Scheme,
    train_len: int = 64,
    test_len: int = 256,
    dim: int | None = None,
    num_heads: int | None = None,
) -> dict[str, float]:
    """The three measurements for one scheme, as one row of the table every chapter
    prints.

    `distinct` and `decay` are measured within the training length, `drift` and
    `far_weight` on positions up to `test_len`.
    """
    positive_int("train_len", train_len)
    positive_int("test_len", test_len)
    if test_len <= train_len:
        raise ValueError(
            "test_len must exceed train_len, "
            f"got test_len={test_len}, train_len={train_len}"
        )
    long = position_logits(scheme, test_len, dim, num_heads)
    short = long[:, :train_len, :train_len]
    positions = torch.arange(test_len)
    # weights, not logits, see a window
    mask = (
        None
        if scheme.mask_mod is None
        else mask_matrix(scheme.mask_mod, positions, positions)
    )
    return {
        "distinct": distinctness(short),
        "decay": decay_score(similarity_by_distance(short)),
        "drift": window_drift(long, train_len),
        "far_weight": far_attention(long, train_len, mask),
    }
