"""The book's one plotting style: figures sized for the content column, legible at the
size the site shows them.

The site's content column is about 770 px wide. A figure made here is 7.5 in wide at
100 dpi (750 px), so it is shown at its own size, never shrunk: 10 pt text stays about
14 px high. Multi-panel figures are at most three panels wide; heat maps get a labelled
colorbar; position axes get integer ticks. Chapters call `use_book_style()` once.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

COLUMN_PX = 770  # the content column of the built site
DPI = 100
# 750 px at DPI (a tight bounding box adds a few): the figure fits the column unscaled
WIDTH_IN = 7.5
MAX_COLUMNS = 3

STYLE = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "figure.figsize": (WIDTH_IN, 3.2),
    "figure.constrained_layout.use": True,
    "font.size": 10,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 4,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "viridis",
}


def use_book_style() -> None:
    """Apply the book's style to matplotlib (and to the inline backend's PNGs, which use
    figure.dpi)."""
    mpl.rcParams.update(STYLE)
    # the notebook's inline backend keeps its own savefig settings: make its PNG the
    # figure's own size
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except ImportError:
        pass


def figure(nrows: int = 1, ncols: int = 1, height: float | None = None, **kwargs):
    """A figure of the column's width with nrows x ncols panels (at most three wide):
    (fig, axes) as plt.subplots."""
    if not isinstance(ncols, int) or not 1 <= ncols <= MAX_COLUMNS:
        raise ValueError(
            f"ncols must be an integer from 1 to {MAX_COLUMNS}: wider figures are "
            f"shrunk until their text is unreadable; got {ncols!r}"
        )
    if not isinstance(nrows, int) or nrows < 1:
        raise ValueError(f"nrows must be a positive integer, got {nrows!r}")
    height = (3.0 if ncols == 1 else 2.7) * nrows if height is None else height
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(nrows, ncols, figsize=(WIDTH_IN, height), dpi=DPI, **kwargs)


def integer_ticks(ax, axis: str = "both") -> None:
    """Ticks at whole numbers only (positions, distances, head indices)."""
    if axis not in ("x", "y", "both"):
        raise ValueError(f"axis must be one of 'x', 'y', 'both'; got {axis!r}")
    if axis in ("x", "both"):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if axis in ("y", "both"):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def heatmap(
    ax,
    matrix,
    label: str,
    xlabel: str = "key position $j$",
    ylabel: str = "query position $i$",
    **kwargs,
):
    """imshow of a 2-D matrix with a labelled colorbar and integer ticks; returns the
    image."""
    if not label:
        raise ValueError(
            "label must say what the colours mean (it labels the colorbar)"
        )
    values = matrix.detach().cpu().numpy() if hasattr(matrix, "detach") else matrix
    kwargs.setdefault("interpolation", "nearest")
    kwargs.setdefault("aspect", "auto")
    image = ax.imshow(values, **kwargs)
    ax.figure.colorbar(image, ax=ax, label=label, shrink=0.9)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    integer_ticks(ax)
    return image
