"""RoPE over several position axes: axial 2-D RoPE for image patches, and Qwen2-VL's M-RoPE.

Both keep RoPE's rotation of each pair of dimensions and change only *which position*
a pair turns with: the pairs of a head are divided into sections, one per axis, and
pair i turns by (the token's position on its axis) x theta_i. Positions on the axes
are "coordinates", a tensor of shape (axes, L) or (axes, batch, L). The two differ in
the frequencies:

* axial RoPE (EVA-02, Heo et al. 2024, Qwen2-VL's vision encoder; FLUX with three axes)
  gives each axis its own full ladder base^(-2i/d_axis) over its section, so rows and
  columns are resolved alike, each with half the pairs;
* M-RoPE (Qwen2-VL) keeps the one ladder base^(-2i/d_h) of the language model and gives
  its first `mrope_section[0]` pairs (the fastest) to time, the next to height and the
  last (slowest) to width. With the same id on every axis it is exactly 1-D RoPE, so
  text tokens (t = h = w) keep the language model's RoPE.

A pair sees the query-key difference along its axis only, so the logit depends on
the differences of the coordinates (drow, dcol), or (dt, dh, dw): the relative property
of RoPE, per axis. For grids larger than the training grid, axial RoPE's ladders can be
rescaled axis by axis (per_axis_frequencies: FiT's VisionNTK and VisionYaRN).
"""

from __future__ import annotations

import torch

from .._checks import (
    PAIRS,
    as_positions,
    choice,
    non_negative_int,
    positive_int,
    same_last_dim,
)
from ..scheme import Scheme, register
from .rope import (
    LAYOUTS,
    NUMERICS,
    _angle_dtype,
    _check_x,
    rope_frequencies,
    rotate_pairs,
)
from .rope_scaling import default_inv_freq


def _sections(name: str, sections, head_dim: int) -> tuple[int, ...]:
    positive_int("head_dim", head_dim, even=PAIRS)
    if (
        isinstance(sections, (str, bytes))
        or not hasattr(sections, "__len__")
        or len(sections) < 2
    ):
        raise TypeError(
            f"{name} must be a list of at least two pair counts, one per axis, got {sections!r}"
        )
    counts = tuple(positive_int(f"{name}[{i}]", s) for i, s in enumerate(sections))
    if sum(counts) != head_dim // 2:
        raise ValueError(
            f"{name} {list(counts)} sums to {sum(counts)}, but a head of {head_dim} dimensions has head_dim / 2 = {head_dim // 2} pairs to divide"
        )
    return counts


def axis_of_pairs(sections, interleaved: bool = False) -> torch.Tensor:
    """The axis each pair turns with: sections in order (0 0 .. 1 1 .. 2 2 ..), or interleaved as Qwen3-VL's M-RoPE.

    Interleaved, axis k > 0 takes pairs k, k + A, k + 2A, ... (A axes), sections[k] of them,
    and axis 0 every other pair, so every axis spans fast and slow frequencies.
    """
    counts = [positive_int(f"sections[{i}]", s) for i, s in enumerate(sections)]
    if not interleaved:
        return torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    axes = torch.zeros(sum(counts), dtype=torch.int64)
    for k, count in enumerate(counts[1:], start=1):
        picked = torch.arange(k, len(counts) * count, len(counts))
        if picked.numel() != count or int(picked.max()) >= len(axes):
            raise ValueError(
                f"interleaved sections {counts} do not fit: axis {k} needs {count} pairs at stride {len(counts)}"
            )
        axes[picked] = k
    return axes


def axial_frequencies(
    head_dim: int, sections, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Per-pair frequencies of axial RoPE: for each axis, the ladder base^(-2i / (2 * section)) over its pairs."""
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
                f"{name} must be one number for every axis or a list of {axes} (one per axis), got {len(value)}: {list(value)}"
            )
        return list(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value] * axes
    raise TypeError(
        f"{name} must be a number or a list of {axes} numbers (one per axis), got {value!r}"
    )


def per_axis_frequencies(
    head_dim: int,
    sections,
    base: float = 10000.0,
    rope_type: str = "default",
    numerics: str = "float64",
    **params,
) -> tuple[torch.Tensor, float]:
    """Axial RoPE's frequencies with each axis rescaled by its own factor: FiT's VisionNTK and VisionYaRN (Lu et al., 2024).

    Axis k's ladder over its 2 * sections[k] dimensions is the 1-D schedule `rope_type`
    ("default", "linear", "ntk" or "yarn", from rope_scaling, named as Hugging Face names
    them) formed for head_dim 2 * sections[k], with `factor` and `original_max_position_embeddings`
    (YaRN's training length: the axis's training extent, rows or columns) taken per axis
    where they are lists; the other parameters (beta_fast, ...) are shared. FiT sets factor[k]
    = max(test extent / training extent, 1) on each axis (per_axis_factors). Returns
    (inv_freq, attention_factor): the attention factor is the largest over the axes, so
    YaRN's 0.1 ln(s) + 1 with s the largest factor, applied once to cos and sin, as FiT
    applies its mscale of the longer side; it is 1 for the other schedules.
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
    """FiT's per-axis scale factors: max(test / train, 1) on each axis (a grid smaller than the training grid is not rescaled)."""
    if (
        not isinstance(train_extents, (tuple, list))
        or not isinstance(test_extents, (tuple, list))
        or len(train_extents) != len(test_extents)
    ):
        raise TypeError(
            f"train_extents and test_extents must be lists of one extent per axis, of the same length, got {train_extents!r} and {test_extents!r}"
        )
    train = [
        positive_int(f"train_extents[{k}]", n) for k, n in enumerate(train_extents)
    ]
    test = [positive_int(f"test_extents[{k}]", n) for k, n in enumerate(test_extents)]
    return tuple(max(b / a, 1.0) for a, b in zip(train, test))


def multi_axis_cos_sin(
    coords: torch.Tensor,
    inv_freq: torch.Tensor,
    axis_of_pair: torch.Tensor,
    like: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of coords[axis_of_pair[i]] * inv_freq[i] for every pair i, in like's dtype.

    coords is (axes, L) or (axes, batch, L); the result is (L, pairs), or (batch, 1, L, pairs)
    for like of shape (batch, heads, L, head_dim). Angles are formed in float32 (float64
    for float64 inputs), as RoPE's are, then cast.
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
    """RoPE with each pair turning by the position on its own axis; subclasses fix the frequencies and the axes."""

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
        """Coordinates (axes, L) for 1-D positions (L,): each scheme says how it reads a plain sequence."""
        raise NotImplementedError

    def coords(self, positions, length: int, batch: int) -> torch.Tensor:
        """(axes, L) or (axes, batch, L) coordinates from what transform_qk received (coordinates, a range or a 1-D tensor)."""
        if isinstance(positions, range):
            positions = torch.arange(positions.start, positions.stop, positions.step)
        p = as_positions("positions", positions, integer=False)
        if p.ndim == 2 and p.shape[0] == self.position_axes == batch:
            raise ValueError(
                f"positions of shape {tuple(p.shape)} are ambiguous for {type(self).__name__} with a batch of {batch}: per-row "
                f"positions (batch, {length}) or coordinates ({self.position_axes}, {length})? Give coordinates as "
                f"({self.position_axes}, batch, {length}) (posenc.attention and KVCache pass q_coords and k_coords so)"
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
            f"positions for {type(self).__name__} must be coordinates of shape ({self.position_axes}, {length}) or "
            f"({self.position_axes}, batch, {length}) = ({self.position_axes}, {batch}, {length}), one row per axis ({axes}), "
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


@register
class AxialRope(MultiAxisRope):
    """Axial RoPE: the pairs of each head divided between axes, each axis with its own frequency ladder.

    The default is 2-D for image patches: (row, col) coordinates, head_dim / 4 pairs per
    axis (EVA-02; Qwen2-VL's vision encoder in the half layout). `sections` gives the pairs
    per axis, e.g. (8, 28, 28) for FLUX's axes_dim (16, 56, 56). 1-D positions are read
    as raster indices of a grid `grid_width` patches wide, (p // grid_width, p % grid_width);
    change grid_width to run the same scheme on another resolution.

    `rope_type` ("linear", "ntk", "yarn") with `factor` (and, for YaRN,
    `original_max_position_embeddings`), each one number or one per axis, rescales every
    axis's ladder by its own factor (per_axis_frequencies: FiT's VisionNTK and VisionYaRN).
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
                    f"head_dim must be a multiple of 4 for axial 2-D RoPE (each of the two axes rotates head_dim / 4 pairs), got {head_dim}"
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
                f"grid_width reads 1-D positions as (row, col): it needs two sections, got {len(counts)}"
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
        """(inv_freq, attention_factor): a ladder per axis, rescaled per axis for a rope_type other than "default"."""
        if rope_type == "default" and not rope_params:
            return axial_frequencies(head_dim, sections, base, NUMERICS[numerics]), 1.0
        return per_axis_frequencies(
            head_dim, sections, base, rope_type, numerics, **rope_params
        )

    def from_sequence(self, p: torch.Tensor) -> torch.Tensor:
        if self.grid_width is None:
            raise ValueError(
                f"AxialRope reads coordinates on {self.position_axes} axes: give a ({self.position_axes}, seq_len) or "
                f"({self.position_axes}, batch, seq_len) tensor (q_coords and k_coords in posenc.attention), or set "
                "grid_width to read 1-D positions as raster indices of a grid"
            )
        return torch.stack(
            (
                torch.div(p, self.grid_width, rounding_mode="floor"),
                torch.remainder(p, self.grid_width),
            )
        )

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        """The rotation, times the attention factor of a per-axis YaRN (as multiplying cos and sin by it; 1 otherwise)."""
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
        return f"head_dim={self.head_dim}, base={self.base:g}, sections={list(self.sections)}, layout={self.layout!r}{width}{scaled}"


def alternate_rung_frequencies(
    head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Pixtral's 2-D frequencies: the one ladder base^(-2i/head_dim), its even rungs for rows, then its odd rungs for columns."""
    ladder = default_inv_freq(
        positive_int("head_dim", head_dim, even=PAIRS), base, dtype
    )
    return torch.cat((ladder[0::2], ladder[1::2]))


@register
class PixtralRope(AxialRope):
    """Pixtral's 2-D RoPE: rows and columns share one ladder, rows on its even rungs and columns on its odd ones.

    Where axial RoPE gives each axis the whole ladder of a head half as wide (rungs
    base^(-4i/d_h)), Pixtral (Mistral AI, 2024; transformers' PixtralVisionRotaryEmbedding)
    forms the ladder of the full head, base^(-2i/d_h), and deals its rungs out alternately:
    rows turn with rungs 0, 2, 4, ... (the same frequencies as axial RoPE's), columns with
    rungs 1, 3, 5, ..., each a factor base^(-2/d_h) slower than the row rung before it.
    Rows take the first head_dim / 4 pairs, columns the rest; coordinates and grid_width
    as AxialRope's.
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
        return f"head_dim={self.head_dim}, base={self.base:g}, layout={self.layout!r}{width}"


def default_mrope_section(head_dim: int) -> tuple[int, int, int]:
    """Qwen2-VL's proportions for any head: 3/8 of the pairs to height, 3/8 to width, the rest to time ((16, 24, 24) at 128)."""
    pairs = positive_int("head_dim", head_dim, even=PAIRS) // 2
    if pairs < 3:
        raise ValueError(
            f"M-RoPE needs at least 3 pairs (one per axis), so head_dim >= 6; got {head_dim}"
        )
    spatial = max(1, 3 * pairs // 8)
    return (pairs - 2 * spatial, spatial, spatial)


@register
class MRope(MultiAxisRope):
    """Qwen2-VL's multimodal RoPE: one frequency ladder, its pairs divided between time, height and width ids.

    `mrope_section` (pairs per axis, summing to head_dim / 2) is Hugging Face's config key;
    `mrope_interleaved=True` spreads the axes over the ladder as Qwen3-VL does. Coordinates
    are (3, L) or (3, batch, L) (transformers' position_ids); 1-D positions are text,
    t = h = w, for which M-RoPE is 1-D RoPE.
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
                f"mrope_section must have three entries (time, height, width), got {list(counts)}"
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
        return f"head_dim={self.head_dim}, base={self.base:g}, mrope_section={list(self.mrope_section)}, layout={self.layout!r}{inter}"


def grid_positions(height: int, width: int) -> torch.Tensor:
    """(2, height * width) coordinates (row, col) of a grid of patches in raster order (row by row)."""
    rows, cols = torch.meshgrid(
        torch.arange(positive_int("height", height)),
        torch.arange(positive_int("width", width)),
        indexing="ij",
    )
    return torch.stack((rows.flatten(), cols.flatten()))


def mrope_positions(parts, start: int = 0) -> torch.Tensor:
    """Qwen2-VL's (3, L) position ids for a sequence of text runs and image or video grids.

    `parts` lists, in order, ints (a run of that many text tokens) and (t, h, w) tuples
    (an image, t = 1, or a video, as a grid of tokens after merging). A text token at the
    running id c gets (c, c, c); a grid starting at c gets (c + frame, c + row, c + col);
    whatever follows starts at the largest id so far plus one (Wang et al., 2024), which
    is below the number of tokens so far once a grid has more than one row or column.
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
                f"parts[{i}] must be an int (text tokens) or a (t, h, w) grid, got {part!r}"
            )
        current = int(pieces[-1].max()) + 1
    if not pieces:
        raise ValueError("parts must list at least one text run or grid")
    return torch.cat(pieces, dim=1)
