"""Axial RoPE over image patches: each axis its own frequency ladder.

Axial RoPE (EVA-02, Heo et al. 2024, Qwen2-VL's vision encoder; FLUX with three axes)
gives each axis its own full ladder base^(-2i/d_axis) over its section of the pairs, so
rows and columns are resolved alike, each with half the pairs; Pixtral deals the rungs
of the full head's ladder out to rows and columns in turn. For grids larger than the
training grid, the ladders can be rescaled axis by axis (per_axis_frequencies: FiT's
VisionNTK and VisionYaRN).

The machinery shared with M-RoPE is in posenc.qk.multi_axis and M-RoPE in
posenc.qk.mrope; their names are importable from here too, as before.
"""

from __future__ import annotations

import torch

from .._checks import PAIRS, choice, positive_int
from ..scheme import register
from .mrope import MRope, default_mrope_section, mrope_positions
from .multi_axis import MultiAxisRope, _sections, axis_of_pairs, multi_axis_cos_sin
from .rope import NUMERICS, rope_frequencies
from .rope_scaling import default_inv_freq

__all__ = [
    "PER_AXIS_PARAMETERS",
    "PER_AXIS_ROPE_TYPES",
    "AxialRope",
    "MRope",
    "MultiAxisRope",
    "PixtralRope",
    "alternate_rung_frequencies",
    "axial_frequencies",
    "axis_of_pairs",
    "default_mrope_section",
    "grid_positions",
    "mrope_positions",
    "multi_axis_cos_sin",
    "per_axis_factors",
    "per_axis_frequencies",
]


def axial_frequencies(
    head_dim: int, sections, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Per-pair frequencies of axial RoPE: for each axis, the ladder
    base^(-2i / (2 * section)) over its pairs."""
    counts = _sections("sections", sections, head_dim)
    return torch.cat([default_inv_freq(2 * s, base, dtype) for s in counts])


PER_AXIS_ROPE_TYPES = ("default", "linear", "ntk", "yarn")
PER_AXIS_PARAMETERS = (
    "factor",
    "original_max_position_embeddings",
)  # one value, or one per axis


def _one_per_axis(name: str, value, axes: int) -> list:
    if isinstance(value, (tuple, list)):
        if len(value) != axes:
            raise ValueError(
                f"{name} must be one number for every axis or a list of {axes} "
                f"(one per axis), got {len(value)}: {list(value)}"
            )
        return list(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value] * axes
    raise TypeError(
        f"{name} must be a number or a list of {axes} numbers (one per axis), "
        f"got {value!r}"
    )


def per_axis_frequencies(
    head_dim: int,
    sections,
    base: float = 10000.0,
    rope_type: str = "default",
    numerics: str = "float64",
    **params,
) -> tuple[torch.Tensor, float]:
    """Axial RoPE's frequencies with each axis rescaled by its own factor: FiT's
    VisionNTK and VisionYaRN (Lu et al., 2024).

    Axis k's ladder over its 2 * sections[k] dimensions is the 1-D schedule
    `rope_type` ("default", "linear", "ntk" or "yarn", from rope_scaling, named as
    Hugging Face names them) formed for head_dim 2 * sections[k], with `factor` and
    `original_max_position_embeddings` (YaRN's training length: the axis's training
    extent, rows or columns) taken per axis where they are lists; the other parameters
    (beta_fast, ...) are shared. Here factor[k] = max(test extent / training extent,
    1) on each axis (per_axis_factors; FiT states its factors against its training
    token budget). Returns (inv_freq, attention_factor): the attention factor is the
    largest over the axes, so YaRN's 0.1 ln(s) + 1 with s the largest factor, applied
    once to cos and sin, as FiT applies its mscale of the longer side; it is 1 for the
    other schedules.
    """
    counts = _sections("sections", sections, head_dim)
    choice("rope_type", rope_type, PER_AXIS_ROPE_TYPES)
    per_axis = {
        name: _one_per_axis(name, params.pop(name), len(counts))
        for name in PER_AXIS_PARAMETERS
        if name in params
    }
    ladders, factors = [], []
    for k, count in enumerate(counts):
        inv_freq, attention_factor = rope_frequencies(
            2 * count,
            base,
            rope_type,
            numerics,
            **params,
            **{name: v[k] for name, v in per_axis.items()},
        )
        ladders.append(inv_freq)
        factors.append(attention_factor)
    return torch.cat(ladders), max(factors)


def per_axis_factors(train_extents, test_extents) -> tuple[float, ...]:
    """Per-axis scale factors as FiT uses them: max(test / train, 1) on each axis (a
    grid smaller than the training grid is not rescaled)."""
    if (
        not isinstance(train_extents, (tuple, list))
        or not isinstance(test_extents, (tuple, list))
        or len(train_extents) != len(test_extents)
    ):
        raise TypeError(
            "train_extents and test_extents must be lists of one extent per axis, of "
            f"the same length, got {train_extents!r} and {test_extents!r}"
        )
    train = [
        positive_int(f"train_extents[{k}]", n) for k, n in enumerate(train_extents)
    ]
    test = [positive_int(f"test_extents[{k}]", n) for k, n in enumerate(test_extents)]
    return tuple(max(b / a, 1.0) for a, b in zip(train, test))


@register
class AxialRope(MultiAxisRope):
    """Axial RoPE: the pairs of each head divided between axes, each axis with its own
    frequency ladder.

    The default is 2-D for image patches: (row, col) coordinates, head_dim / 4 pairs
    per axis (EVA-02; Qwen2-VL's vision encoder in the half layout). `sections` gives
    the pairs per axis, e.g. (8, 28, 28) for FLUX's axes_dim (16, 56, 56). 1-D
    positions are read as raster indices of a grid `grid_width` patches wide,
    (p // grid_width, p % grid_width); change grid_width to run the same scheme on
    another resolution.

    `rope_type` ("linear", "ntk", "yarn") with `factor` (and, for YaRN,
    `original_max_position_embeddings`), each one number or one per axis, rescales
    every axis's ladder by its own factor (per_axis_frequencies: FiT's VisionNTK and
    VisionYaRN). Registered as ``"axial_rope"``.

    Args:
        head_dim: the width of a head; a multiple of 4 without `sections`.
        base: the base of every axis's ladder.
        sections: the pairs per axis, summing to head_dim / 2; None for two equal
            axes.
        layout: ``"half"`` or ``"interleaved"`` (posenc.qk.rope.LAYOUTS).
        numerics: ``"float64"`` or ``"transformers"``, as in posenc.rope_frequencies.
        grid_width: read 1-D positions as raster indices of a grid this many patches
            wide; None to require coordinates.
        rope_type: ``"default"``, or a per-axis rescaling (``"linear"``, ``"ntk"``,
            ``"yarn"``).
        **rope_params: the rescaling's parameters (``factor``, ...), each one number
            or one per axis.

    Raises:
        ValueError: `head_dim` is not a multiple of 4 (without `sections`), the
            sections do not sum to head_dim / 2, `grid_width` is given for other than
            two axes, or `layout`, `numerics` or `rope_type` is unknown; on use, 1-D
            positions without `grid_width`, or coordinates of another shape.
        TypeError: `head_dim` is not an integer.

    Example:
        >>> import torch, posenc
        >>> from posenc.qk import grid_positions
        >>> axial = posenc.AxialRope(head_dim=16)
        >>> coords = grid_positions(2, 3)  # (row, col) of 2 x 3 patches
        >>> coords.tolist()
        [[0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]]
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 16, generator=g)
        >>> out = posenc.attention(
        ...     q, k, v, axial, causal=False, q_coords=coords, k_coords=coords
        ... )
        >>> out.shape
        torch.Size([1, 2, 6, 16])
        >>> raster = posenc.AxialRope(16, grid_width=3)  # 1-D positions, row by row
        >>> torch.equal(
        ...     raster.transform_qk(q, torch.arange(6)), axial.transform_qk(q, coords)
        ... )
        True
    """

    name = "axial_rope"
    position_axes = 2  # by default; three or more with `sections`
    axis_names = ("row", "col")

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        sections=None,
        layout: str = "half",
        numerics: str = "float64",
        grid_width: int | None = None,
        rope_type: str = "default",
        **rope_params,
    ):
        if sections is None:
            if positive_int("head_dim", head_dim, even=PAIRS) % 4:
                raise ValueError(
                    "head_dim must be a multiple of 4 for axial 2-D RoPE (each of the "
                    f"two axes rotates head_dim / 4 pairs), got {head_dim}"
                )
            sections = (head_dim // 4, head_dim // 4)
        counts = _sections("sections", sections, head_dim)
        choice("numerics", numerics, tuple(NUMERICS))
        inv_freq, attention_factor = self.frequencies(
            head_dim, counts, base, numerics, rope_type, **rope_params
        )
        super().__init__(head_dim, inv_freq, axis_of_pairs(counts), layout)
        self.rope_type, self.rope_params, self.attention_factor = (
            rope_type,
            rope_params,
            attention_factor,
        )
        if len(counts) != 2:
            self.axis_names = tuple(f"axis {k}" for k in range(len(counts)))
        if grid_width is not None and len(counts) != 2:
            raise ValueError(
                "grid_width reads 1-D positions as (row, col): it needs two sections, "
                f"got {len(counts)}"
            )
        self.base, self.sections, self.numerics = base, counts, numerics
        self.grid_width = (
            None if grid_width is None else positive_int("grid_width", grid_width)
        )

    @staticmethod
    def frequencies(
        head_dim: int,
        sections,
        base: float,
        numerics: str,
        rope_type: str = "default",
        **rope_params,
    ) -> tuple[torch.Tensor, float]:
        """(inv_freq, attention_factor): a ladder per axis, rescaled per axis for a
        rope_type other than "default"."""
        if rope_type == "default" and not rope_params:
            return axial_frequencies(head_dim, sections, base, NUMERICS[numerics]), 1.0
        return per_axis_frequencies(
            head_dim, sections, base, rope_type, numerics, **rope_params
        )

    def from_sequence(self, p: torch.Tensor) -> torch.Tensor:
        if self.grid_width is None:
            raise ValueError(
                f"AxialRope reads coordinates on {self.position_axes} axes: give a "
                f"({self.position_axes}, seq_len) or "
                f"({self.position_axes}, batch, seq_len) tensor (q_coords and "
                "k_coords in posenc.attention), or set grid_width to read 1-D "
                "positions as raster indices of a grid"
            )
        return torch.stack(
            (
                torch.div(p, self.grid_width, rounding_mode="floor"),
                torch.remainder(p, self.grid_width),
            )
        )

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        """The rotation, times the attention factor of a per-axis YaRN (as multiplying
        cos and sin by it; 1 otherwise)."""
        rotated = super().transform_qk(x, positions)
        return (
            rotated if self.attention_factor == 1.0 else rotated * self.attention_factor
        )

    def extra_repr(self) -> str:
        width = "" if self.grid_width is None else f", grid_width={self.grid_width}"
        scaled = (
            ""
            if self.rope_type == "default"
            else f", rope_type={self.rope_type!r}"
            + "".join(f", {k}={v!r}" for k, v in self.rope_params.items())
        )
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, "
            f"sections={list(self.sections)}, layout={self.layout!r}{width}{scaled}"
        )


def alternate_rung_frequencies(
    head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Pixtral's 2-D frequencies: the one ladder base^(-2i/head_dim), its even rungs for
    rows, then its odd rungs for columns."""
    ladder = default_inv_freq(
        positive_int("head_dim", head_dim, even=PAIRS), base, dtype
    )
    return torch.cat((ladder[0::2], ladder[1::2]))


@register
class PixtralRope(AxialRope):
    """Pixtral's 2-D RoPE: rows and columns share one ladder, rows on its even rungs and
    columns on its odd ones.

    Where axial RoPE gives each axis the whole ladder of a head half as wide (rungs
    base^(-4i/d_h)), Pixtral (Mistral AI, 2024; transformers'
    PixtralVisionRotaryEmbedding) forms the ladder of the full head, base^(-2i/d_h),
    and deals its rungs out alternately: rows turn with rungs 0, 2, 4, ... (the same
    frequencies as axial RoPE's), columns with rungs 1, 3, 5, ..., each a factor
    base^(-2/d_h) slower than the row rung before it. Rows take the first head_dim / 4
    pairs, columns the rest; coordinates and grid_width as AxialRope's.
    """

    name = "pixtral_rope"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        layout: str = "half",
        numerics: str = "float64",
        grid_width: int | None = None,
    ):
        super().__init__(
            head_dim, base, layout=layout, numerics=numerics, grid_width=grid_width
        )

    @staticmethod
    def frequencies(
        head_dim: int,
        sections,
        base: float,
        numerics: str,
        rope_type: str = "default",
        **rope_params,
    ) -> tuple[torch.Tensor, float]:
        return alternate_rung_frequencies(head_dim, base, NUMERICS[numerics]), 1.0

    def extra_repr(self) -> str:
        width = "" if self.grid_width is None else f", grid_width={self.grid_width}"
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, "
            f"layout={self.layout!r}{width}"
        )


def grid_positions(height: int, width: int) -> torch.Tensor:
    """(2, height * width) coordinates (row, col) of a grid of patches in raster order
    (row by row)."""
    rows, cols = torch.meshgrid(
        torch.arange(positive_int("height", height)),
        torch.arange(positive_int("width", width)),
        indexing="ij",
    )
    return torch.stack((rows.flatten(), cols.flatten()))
