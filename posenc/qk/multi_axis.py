"""RoPE over several position axes: the machinery axial 2-D RoPE and M-RoPE share.

Both keep RoPE's rotation of each pair of dimensions and change only *which position*
a pair turns with: the pairs of a head are divided into sections, one per axis, and
pair i turns by (the token's position on its axis) x theta_i. Positions on the axes
are "coordinates", a tensor of shape (axes, L) or (axes, batch, L). A pair sees the
query-key difference along its axis only, so the logit depends on the differences of
the coordinates (drow, dcol), or (dt, dh, dw): the relative property of RoPE, per axis.

This module holds what both share: the sections (`axis_of_pairs`, contiguous or
interleaved as Qwen3-VL's), cos and sin per pair (`multi_axis_cos_sin`) and the scheme
class (`MultiAxisRope`). The frequencies are the subclasses': `posenc.qk.axial`
(AxialRope, PixtralRope) and `posenc.qk.mrope` (MRope).
"""

from __future__ import annotations

import torch

from .._checks import PAIRS, as_positions, choice, positive_int, same_last_dim
from ..scheme import Scheme
from .rope import LAYOUTS
from .rotation import _angle_dtype, _check_x, rotate_pairs


def _sections(name: str, sections, head_dim: int) -> tuple[int, ...]:
    positive_int("head_dim", head_dim, even=PAIRS)
    if (
        isinstance(sections, (str, bytes))
        or not hasattr(sections, "__len__")
        or len(sections) < 2
    ):
        raise TypeError(
            f"{name} must be a list of at least two pair counts, one per axis, "
            f"got {sections!r}"
        )
    counts = tuple(positive_int(f"{name}[{i}]", s) for i, s in enumerate(sections))
    if sum(counts) != head_dim // 2:
        raise ValueError(
            f"{name} {list(counts)} sums to {sum(counts)}, but a head of {head_dim} "
            f"dimensions has head_dim / 2 = {head_dim // 2} pairs to divide"
        )
    return counts


def axis_of_pairs(sections, interleaved: bool = False) -> torch.Tensor:
    """The axis each pair turns with: sections in order (0 0 .. 1 1 .. 2 2 ..), or
    interleaved as Qwen3-VL's M-RoPE.

    Interleaved, axis k > 0 takes pairs k, k + A, k + 2A, ... (A axes), sections[k] of
    them, and axis 0 every pair left over, so every axis spans fast and slow
    frequencies. For Qwen3-VL's (24, 20, 20) over 64 pairs: height on pairs 1, 4, ...,
    58, width on 2, 5, ..., 59, time on 0, 3, ..., 57 and on 60 to 63 (transformers'
    Qwen3VLTextRotaryEmbedding.recomposition_frequencies).
    """
    counts = [positive_int(f"sections[{i}]", s) for i, s in enumerate(sections)]
    if not interleaved:
        return torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    axes = torch.zeros(sum(counts), dtype=torch.int64)
    for k, count in enumerate(counts[1:], start=1):
        picked = torch.arange(k, len(counts) * count, len(counts))
        if picked.numel() != count or int(picked.max()) >= len(axes):
            raise ValueError(
                f"interleaved sections {counts} do not fit: axis {k} needs {count} "
                f"pairs at stride {len(counts)}"
            )
        axes[picked] = k
    return axes


def multi_axis_cos_sin(
    coords: torch.Tensor,
    inv_freq: torch.Tensor,
    axis_of_pair: torch.Tensor,
    like: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of coords[axis_of_pair[i]] * inv_freq[i] for every pair i, in like's
    dtype.

    coords is (axes, L) or (axes, batch, L); the result is (L, pairs), or
    (batch, 1, L, pairs) for like of shape (batch, heads, L, head_dim). Angles are
    formed in float32 (float64 for float64 inputs), as RoPE's are, then cast.
    """
    dtype = _angle_dtype(like, inv_freq)
    per_pair = coords.to(device=like.device, dtype=dtype).movedim(0, -1)[
        ..., axis_of_pair.to(like.device)
    ]
    if per_pair.ndim == 3 and like.ndim == 4:
        per_pair = per_pair[:, None]  # the heads axis
    angles = per_pair * inv_freq.to(device=like.device, dtype=dtype)
    return angles.cos().to(like.dtype), angles.sin().to(like.dtype)


class MultiAxisRope(Scheme):
    """RoPE with each pair turning by the position on its own axis; subclasses fix the
    frequencies and the axes."""

    hook = "qk"
    axis_names: tuple[str, ...] = ()

    def __init__(
        self,
        head_dim: int,
        inv_freq: torch.Tensor,
        axis_of_pair: torch.Tensor,
        layout: str,
    ):
        super().__init__()
        self.layout = choice("layout", layout, LAYOUTS)
        self.head_dim, self.position_axes = head_dim, int(axis_of_pair.max()) + 1
        self.register_float32_buffer("inv_freq", inv_freq)
        self.register_buffer("axis_of_pair", axis_of_pair, persistent=False)

    def from_sequence(self, p: torch.Tensor) -> torch.Tensor:
        """Coordinates (axes, L) for 1-D positions (L,): each scheme says how it reads a
        plain sequence."""
        raise NotImplementedError

    def coords(self, positions, length: int, batch: int) -> torch.Tensor:
        """(axes, L) or (axes, batch, L) coordinates from what transform_qk received
        (coordinates, a range or a 1-D tensor)."""
        if isinstance(positions, range):
            positions = torch.arange(positions.start, positions.stop, positions.step)
        p = as_positions("positions", positions, integer=False)
        if p.ndim == 2 and p.shape[0] == self.position_axes == batch:
            raise ValueError(
                f"positions of shape {tuple(p.shape)} are ambiguous for "
                f"{type(self).__name__} with a batch of {batch}: per-row "
                f"positions (batch, {length}) or coordinates "
                f"({self.position_axes}, {length})? Give coordinates as "
                f"({self.position_axes}, batch, {length}) (posenc.attention and "
                "KVCache pass q_coords and k_coords so)"
            )
        c = self.from_sequence(p) if p.ndim == 1 else p
        if (
            c.ndim in (2, 3)
            and c.shape[0] == self.position_axes
            and c.shape[-1] == length
            and (c.ndim == 2 or c.shape[1] == batch)
        ):
            return c
        axes = ", ".join(self.axis_names)
        raise ValueError(
            f"positions for {type(self).__name__} must be coordinates of shape "
            f"({self.position_axes}, {length}) or "
            f"({self.position_axes}, batch, {length}) = "
            f"({self.position_axes}, {batch}, {length}), one row per axis ({axes}), "
            f"or 1-D positions ({length},); got {tuple(p.shape)}"
        )

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        _check_x(x)
        same_last_dim(
            "x", x, self.head_dim, f"{type(self).__name__}(head_dim={self.head_dim})"
        )
        coords = self.coords(positions, x.shape[-2], x.shape[0] if x.ndim == 4 else 1)
        cos, sin = multi_axis_cos_sin(coords, self.inv_freq, self.axis_of_pair, x)
        return rotate_pairs(x, cos, sin, self.layout)
