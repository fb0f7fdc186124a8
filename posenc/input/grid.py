"""Absolute codes for a grid of image patches: the 2-D sinusoidal code, and resizing a
position table to a new grid.

A vision transformer cuts an image into a grid of patches and reads them as a sequence.
An absolute code can still say where each patch is in two dimensions: MAE and SD3 use a
2-D sinusoidal code (half of the width encodes the row, half the column); ViT learns a
table with one vector per patch and, to run at another resolution, resizes that table
as an image (bicubic interpolation), which stretches it rather than extending it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import as_positions, choice, positive_int
from .sinusoidal import sinusoidal_encoding

RESIZE_MODES = ("bicubic", "bilinear", "nearest")


def _grid_size(name: str, size) -> tuple[int, int]:
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise TypeError(
            f"{name} must be a (height, width) pair of positive integers, got {size!r}"
        )
    return positive_int(f"{name}[0] (height)", size[0]), positive_int(
        f"{name}[1] (width)", size[1]
    )


def sinusoidal_2d(coords, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The 2-D sinusoidal code of patches at (row, col) coordinates (2, N): (N, dim),
    row code then column code.

    The first dim / 2 entries are the 1-D sinusoidal code (posenc.sinusoidal_encoding)
    of the row, the last dim / 2 that of the column, so two patches' codes share the
    row half exactly when they share a row. Coordinates may be real numbers
    (interpolated grids). MAE's reference code puts the column (x) first and uses sin
    and cos halves instead of interleaving them: the same code up to a fixed
    permutation of its entries.
    """
    c = as_positions("coords", coords, integer=False)
    if c.ndim != 2 or c.shape[0] != 2:
        raise ValueError(
            "coords must have shape (2, N): a row and a column per patch, "
            f"got {tuple(c.shape)}"
        )
    if positive_int("dim", dim) % 4:
        raise ValueError(
            "dim must be a multiple of 4 (a sin/cos code of even width for each of "
            f"the two axes), got {dim}"
        )
    return torch.cat(
        (
            sinusoidal_encoding(c[0], dim // 2, base),
            sinusoidal_encoding(c[1], dim // 2, base),
        ),
        dim=-1,
    )


def resize_grid_table(
    table: torch.Tensor, size, new_size, mode: str = "bicubic"
) -> torch.Tensor:
    """A (height * width, dim) position table of a raster grid, resized as an image to
    new_size: (new_h * new_w, dim).

    This is how ViT fine-tunes at a higher resolution (Dosovitskiy et al., and Hugging
    Face's ViTEmbeddings.interpolate_pos_encoding): the table is treated as a
    dim-channel image of the grid and interpolated (bicubic, align_corners=False). The
    new table covers the same extent with more patches: one step of the new grid is
    height / new_h steps of the old one, so the code of "the patch above" changes
    meaning. A table with a class token's row must have that row split off first.
    """
    height, width = _grid_size("size", size)
    new_height, new_width = _grid_size("new_size", new_size)
    choice("mode", mode, RESIZE_MODES)
    if (
        not isinstance(table, torch.Tensor)
        or table.ndim != 2
        or table.shape[0] != height * width
    ):
        shape = (
            tuple(table.shape)
            if isinstance(table, torch.Tensor)
            else type(table).__name__
        )
        raise ValueError(
            "table must have shape (height * width, dim) = "
            f"({height * width}, dim) for size {size}, got {shape}"
        )
    image = table.T.reshape(1, table.shape[1], height, width)
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    resized = F.interpolate(image, size=(new_height, new_width), mode=mode, **kwargs)
    return resized.reshape(table.shape[1], new_height * new_width).T
