"""Qwen2-VL's multimodal RoPE (M-RoPE) and the position ids of its sequences.

M-RoPE keeps the one ladder base^(-2i/d_h) of the language model and gives its first
`mrope_section[0]` pairs (the fastest) to time, the next to height and the last
(slowest) to width, or interleaves the three over the ladder as Qwen3-VL does. With the
same id on every axis it is exactly 1-D RoPE, so text tokens (t = h = w) keep the
language model's RoPE. `mrope_positions` builds the (3, L) ids of text runs and image
or video grids; posenc.qk.vl_positions adds Qwen2.5-VL's and Qwen3-VL's.
"""

from __future__ import annotations

import torch

from .._checks import PAIRS, choice, non_negative_int, positive_int
from ..scheme import register
from .multi_axis import MultiAxisRope, _sections, axis_of_pairs
from .rope import NUMERICS
from .rope_scaling import default_inv_freq


def default_mrope_section(head_dim: int) -> tuple[int, int, int]:
    """Qwen2-VL's proportions for any head: 3/8 of the pairs to height, 3/8 to width,
    the rest to time ((16, 24, 24) at 128)."""
    pairs = positive_int("head_dim", head_dim, even=PAIRS) // 2
    if pairs < 3:
        raise ValueError(
            "M-RoPE needs at least 3 pairs (one per axis), so head_dim >= 6; "
            f"got {head_dim}"
        )
    spatial = max(1, 3 * pairs // 8)
    return (pairs - 2 * spatial, spatial, spatial)


@register
class MRope(MultiAxisRope):
    """Qwen2-VL's multimodal RoPE: one frequency ladder, its pairs divided between time,
    height and width ids.

    `mrope_section` (pairs per axis, summing to head_dim / 2) is Hugging Face's config
    key; `mrope_interleaved=True` spreads the axes over the ladder as Qwen3-VL does
    (axis_of_pairs). Coordinates are (3, L) or (3, batch, L) (transformers'
    position_ids); 1-D positions are text, t = h = w, for which M-RoPE is 1-D RoPE.
    Registered as ``"mrope"``.

    Args:
        head_dim: the width of a head, even.
        base: the base of the one ladder.
        mrope_section: the pairs of time, height and width, summing to head_dim / 2;
            None for `default_mrope_section`.
        layout: ``"half"`` or ``"interleaved"`` (posenc.qk.rope.LAYOUTS).
        numerics: ``"float64"`` or ``"transformers"``, as in posenc.rope_frequencies.
        mrope_interleaved: spread the axes over the ladder (Qwen3-VL).

    Raises:
        ValueError: `mrope_section` has not three entries or does not sum to
            head_dim / 2, or `layout` or `numerics` is unknown; on use, coordinates
            of another shape.
        TypeError: `head_dim` is not an integer.

    Example:
        >>> import torch, posenc
        >>> from posenc.qk import mrope_positions
        >>> mrope = posenc.MRope(head_dim=16)
        >>> coords = mrope_positions([2, (1, 2, 2), 1])  # text, a 2 x 2 image, text
        >>> coords.tolist()
        [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 7, 16, generator=g)
        >>> posenc.attention(q, k, v, mrope, q_coords=coords, k_coords=coords).shape
        torch.Size([1, 2, 7, 16])
        >>> text = torch.arange(7)  # 1-D positions are text: t = h = w, plain RoPE
        >>> rope = posenc.Rope(head_dim=16)
        >>> torch.testing.assert_close(
        ...     mrope.transform_qk(q, text), rope.transform_qk(q, text)
        ... )
    """

    name = "mrope"
    position_axes = 3
    axis_names = ("time", "height", "width")

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        mrope_section=None,
        layout: str = "half",
        numerics: str = "float64",
        mrope_interleaved: bool = False,
    ):
        counts = _sections(
            "mrope_section",
            default_mrope_section(head_dim) if mrope_section is None else mrope_section,
            head_dim,
        )
        if len(counts) != 3:
            raise ValueError(
                "mrope_section must have three entries (time, height, width), "
                f"got {list(counts)}"
            )
        choice("numerics", numerics, tuple(NUMERICS))
        super().__init__(
            head_dim,
            default_inv_freq(head_dim, base, NUMERICS[numerics]),
            axis_of_pairs(counts, bool(mrope_interleaved)),
            layout,
        )
        self.base, self.mrope_section, self.numerics, self.mrope_interleaved = (
            base,
            counts,
            numerics,
            bool(mrope_interleaved),
        )

    def from_sequence(self, p: torch.Tensor) -> torch.Tensor:
        return p.expand(3, *p.shape)

    def extra_repr(self) -> str:
        inter = ", mrope_interleaved=True" if self.mrope_interleaved else ""
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, "
            f"mrope_section={list(self.mrope_section)}, layout={self.layout!r}{inter}"
        )


def mrope_positions(parts, start: int = 0) -> torch.Tensor:
    """Qwen2-VL's (3, L) position ids for a sequence of text runs and image or video
    grids.

    `parts` lists, in order, ints (a run of that many text tokens) and (t, h, w)
    tuples (an image, t = 1, or a video, as a grid of tokens after merging). A text
    token at the running id c gets (c, c, c); a grid starting at c gets
    (c + frame, c + row, c + col); whatever follows starts at the largest id so far
    plus one (Wang et al., 2024), which is below the number of tokens so far once a
    grid has more than one row or column.
    """
    current, pieces = non_negative_int("start", start), []
    for i, part in enumerate(parts):
        if isinstance(part, int) and not isinstance(part, bool):
            run = torch.arange(current, current + positive_int(f"parts[{i}]", part))
            pieces.append(run.expand(3, -1))
        elif isinstance(part, (tuple, list)) and len(part) == 3:
            t, h, w = (positive_int(f"parts[{i}][{k}]", n) for k, n in enumerate(part))
            grid = torch.stack(
                torch.meshgrid(
                    torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"
                )
            ).reshape(3, -1)
            pieces.append(grid + current)
        else:
            raise TypeError(
                f"parts[{i}] must be an int (text tokens) or a (t, h, w) grid, "
                f"got {part!r}"
            )
        current = int(pieces[-1].max()) + 1
    if not pieces:
        raise ValueError("parts must list at least one text run or grid")
    return torch.cat(pieces, dim=1)
