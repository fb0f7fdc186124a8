"""Where queries and keys sit, and how a kernel's indices map to those positions.

`posenc.attention` takes positions of shape (seq_len,), shared by the batch, or
(batch, seq_len), one row per sequence (left padding, packed sequences). Without
them keys sit at 0..k_len-1 and queries at the last q_len of those: the *default
layout*, in which a position is an index plus a constant, so a score_mod or
mask_mod over it stays a pure function of the indices and its block mask and
dense tables can be cached per shape.

A scheme with several position axes (`Scheme.position_axes` > 1: a patch's row and
column, or Qwen2-VL's time, height and width ids) also takes *coordinates*,
`q_coords` and `k_coords` of shape (axes, L) or (axes, batch, L). They reach only
the query/key transform; masks and biases keep the 1-D order of the sequence (the
default layout, or the positions given beside the coordinates), as a causal mask
follows the order in which tokens arrive, not their place in an image.

*Packed documents.* Positions that start again from 0 inside a row, as in
[0, 1, 2, 0, 1], mark documents packed one after another: each document sees only its
own tokens, and within one the masks follow positions as usual (so order in the
stream). A row counts as packed when every step that does not increase lands on 0;
positions in any other order (a scrambled or random order, as the chapters use to show
relativity) are one document. This is Hugging Face's rule for packed position ids,
except that a gap (a step of more than one, as a rolling cache leaves after evicting)
does not start a document. Queries must then be the last q_len entries of the keys'
stream (a full pass, or a chunk just appended to a cache), so that each query's
document is known.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import as_positions


def default_positions(q_len: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys at 0..k_len-1 and queries at the last q_len of them (decoding against a
    cache)."""
    if q_len > k_len:
        raise ValueError(
            f"without explicit positions q_len ({q_len}) "
            f"must not exceed k_len ({k_len})"
        )
    return torch.arange(k_len - q_len, k_len), torch.arange(k_len)


def relative_distance(q_positions, k_positions) -> torch.Tensor:
    """Matrix of k_position - q_position (j - i in the notation page), shape
    (len(q), len(k)), integer."""
    q = as_positions("q_positions", q_positions, integer=True)
    k = as_positions("k_positions", k_positions, integer=True).to(q.device)
    if q.ndim != 1 or k.ndim != 1:
        raise ValueError(
            "q_positions and k_positions must be one-dimensional, "
            f"got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    return k[None, :] - q[:, None]


def _given(name: str, given, length: int, batch: int) -> torch.Tensor:
    p = as_positions(name, given, integer=True)
    if p.ndim == 1 and p.shape[0] == length:
        return p
    if p.ndim == 2 and p.shape[1] == length:
        if p.shape[0] != batch:
            raise ValueError(
                f"{name} has {p.shape[0]} rows but q has batch {batch}: "
                f"give ({length},) or ({batch}, {length})"
            )
        return p
    raise ValueError(
        f"{name} must have shape ({length},) or (batch, {length}) = "
        f"({batch}, {length}), got {tuple(p.shape)}"
    )


def check_coords(name: str, coords, axes: int, length: int, batch: int) -> torch.Tensor:
    """Coordinates on a scheme's position axes: (axes, length) or
    (axes, batch, length), real numbers allowed."""
    c = as_positions(name, coords, integer=False)
    if (
        c.ndim in (2, 3)
        and c.shape[0] == axes
        and c.shape[-1] == length
        and (c.ndim == 2 or c.shape[1] == batch)
    ):
        # shared by a batch of as many rows as axes, (axes, L) would read as per-row
        # positions: pass (axes, batch, L)
        return (
            c[:, None].expand(axes, batch, length)
            if c.ndim == 2 and batch == axes
            else c
        )
    raise ValueError(
        f"{name} must have shape ({axes}, {length}) or ({axes}, batch, {length}) = "
        f"({axes}, {batch}, {length}): one row of positions per axis of a scheme "
        f"with position_axes={axes}; got {tuple(c.shape)}"
    )


def axis_inputs(
    name: str,
    positions: torch.Tensor | None,
    coords,
    axes: int,
    length: int,
    batch: int,
) -> torch.Tensor | None:
    """Checked coordinates for a query/key transform, or None where the 1-D positions
    serve (one axis, or none given).

    A scheme with one axis takes no coordinates; a scheme with several takes 1-D
    positions shared by the batch (M-RoPE reads them as equal ids), but per-row
    positions (batch, L) only as coordinates (axes, batch, L), which cannot be mistaken
    for (axes, L).
    """
    if coords is not None:
        if axes == 1:
            raise ValueError(
                f"{name} is for schemes with several position axes "
                "(position_axes > 1: AxialRope, MRope); this scheme has one: "
                "give its positions alone"
            )
        return check_coords(name, coords, axes, length, batch)
    if axes > 1 and positions is not None and positions.ndim == 2:
        raise ValueError(
            f"per-row positions {tuple(positions.shape)} for a scheme with "
            f"position_axes={axes} need {name} of shape ({axes}, batch, {length})"
        )
    return None


def documents(positions: torch.Tensor) -> torch.Tensor | None:
    """Document ids of packed sequences, the shape of `positions`: in a row whose every
    non-increasing step lands on 0, each such step starts a document.

    None where no row is packed (one document per row).
    """
    restart = positions[..., 1:] <= positions[..., :-1]
    # rows whose every restart is to 0
    packed = ~(restart & (positions[..., 1:] != 0)).any(-1, keepdim=True)
    restart = restart & packed
    if not bool(restart.any()):
        return None
    return torch.cat((torch.zeros_like(restart[..., :1]), restart), dim=-1).cumsum(-1)


def packed(cu_seqlens) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and document ids of documents packed in one stream, from
    flash-attention's cu_seqlens.

    Args:
        cu_seqlens: [0, n_0, n_0 + n_1, ...], the cumulative lengths of the documents,
            starting at 0 (a sequence or a 1-D integer tensor).

    Returns:
        (positions, documents): positions 0..n_0-1, 0..n_1-1, ... and document ids
        0, 1, ..., each of shape (total,), on the device of `cu_seqlens`, for
        posenc.attention's ``q_documents`` and ``k_documents`` (or KVCache's
        ``documents``): each document then sees only itself.

    Raises:
        ValueError: `cu_seqlens` is not 1-D, does not start at 0 or does not increase.
        TypeError: `cu_seqlens` is not integers.

    Example:
        >>> import torch, posenc
        >>> positions, documents = posenc.positions.packed([0, 3, 5])
        >>> positions.tolist(), documents.tolist()
        ([0, 1, 2, 0, 1], [0, 0, 0, 1, 1])
        >>> x = torch.ones(1, 2, 5, 8)
        >>> ids = dict(q_documents=documents, k_documents=documents)
        >>> _, weights = posenc.attention(x, x, x, return_weights=True, **ids)
        >>> bool(weights[..., 3:, :3].eq(0).all())  # the second sees only itself
        True
    """
    cu = as_positions("cu_seqlens", cu_seqlens, integer=True)
    if (
        cu.ndim != 1
        or len(cu) < 2
        or int(cu[0]) != 0
        or bool((cu[1:] <= cu[:-1]).any())
    ):
        raise ValueError(
            "cu_seqlens must be increasing cumulative lengths starting at 0, "
            f"e.g. [0, 5, 12], got {cu.tolist()}"
        )
    lengths = cu[1:] - cu[:-1]
    documents = torch.repeat_interleave(
        torch.arange(len(lengths), device=cu.device), lengths
    )
    return torch.arange(int(cu[-1]), device=cu.device) - cu[:-1][documents], documents


def _is_arange(p: torch.Tensor, start: int) -> bool:
    return p.ndim == 1 and torch.equal(
        p, torch.arange(start, start + len(p), device=p.device, dtype=p.dtype)
    )


@dataclass(frozen=True)
class Positions:
    """Positions of one attention call: `q` and `k` are None in the default layout,
    else tensors (L,) or (batch, L).

    `q_coords` and `k_coords` are coordinates on several axes, (axes, L) or
    (axes, batch, L), for the query/key transform only; None where it reads `q`, `k`.
    """

    q_len: int
    k_len: int
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    q_coords: torch.Tensor | None = None
    k_coords: torch.Tensor | None = None
    # document ids where the positions restart (packed documents), else None
    q_doc: torch.Tensor | None = None
    k_doc: torch.Tensor | None = None

    @classmethod
    def resolve(
        cls,
        q_positions,
        k_positions,
        q_len: int,
        k_len: int,
        batch: int,
        device: torch.device,
        *,
        q_coords=None,
        k_coords=None,
        axes: int = 1,
        keys_transformed: bool = False,
        q_documents=None,
        k_documents=None,
    ) -> Positions:
        """Check the given positions; positions equal to the default layout are
        recognised as it.

        Without q_coords, queries take the last q_len of k_coords, as in the default
        layout.
        Keys already transformed (a KV cache) need no coordinates. Document ids given
        explicitly replace the ones read from positions that restart at 0.
        """
        if (q_documents is None) != (k_documents is None):
            raise ValueError(
                "q_documents and k_documents go together: "
                "give both (each token's document) or neither"
            )
        if q_documents is not None and q_positions is None and k_positions is None:
            # documents make the layout explicit
            q_positions, k_positions = default_positions(q_len, k_len)
        if q_positions is None and k_positions is None:
            default_positions(q_len, k_len)  # checks q_len <= k_len
            q = k = None
        else:
            if q_positions is None or k_positions is None:
                dq, dk = default_positions(q_len, k_len)
                q_positions = dq if q_positions is None else q_positions
                k_positions = dk if k_positions is None else k_positions
            q = _given("q_positions", q_positions, q_len, batch)
            k = _given("k_positions", k_positions, k_len, batch)
            if (
                q_len <= k_len
                and _is_arange(k, 0)
                and _is_arange(q, k_len - q_len)
                and q_documents is None
            ):
                q = k = None
        k_coords = (
            None
            if keys_transformed
            else axis_inputs("k_coords", k, k_coords, axes, k_len, batch)
        )
        if q_coords is None and k_coords is not None:
            if q_len > k_len:
                raise ValueError(
                    f"without q_coords, q_len ({q_len}) must not exceed k_len "
                    f"({k_len}): queries take the last k_coords"
                )
            q_coords = k_coords[..., k_len - q_len :]
        q_coords = axis_inputs("q_coords", q, q_coords, axes, q_len, batch)
        if q_documents is None:
            q_doc, k_doc = _documents(q, k)
        else:
            q_doc, k_doc = (
                _given("q_documents", q_documents, q_len, batch),
                _given("k_documents", k_documents, k_len, batch),
            )
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        return cls(
            q_len, k_len, on(q), on(k), on(q_coords), on(k_coords), on(q_doc), on(k_doc)
        )

    @property
    def is_default(self) -> bool:
        return self.q is None

    @property
    def per_row(self) -> bool:
        """True when positions differ between the sequences of the batch."""
        return self.q is not None and (self.q.ndim == 2 or self.k.ndim == 2)

    @property
    def rows(self) -> int:
        """How many sequences the positions or documents tell apart: the batch where
        either is given per row, else 1."""
        given = (self.q, self.k, self.q_doc, self.k_doc)
        return max(
            (t.shape[0] for t in given if t is not None and t.ndim == 2), default=1
        )

    def query_positions(self):
        """What a query/key transform receives: the coordinates if given, a range in
        the default layout (RoPE caches its table for it), else the tensor."""
        if self.q_coords is not None:
            return self.q_coords
        return range(self.k_len - self.q_len, self.k_len) if self.q is None else self.q

    def key_positions(self):
        if self.k_coords is not None:
            return self.k_coords
        return range(self.k_len) if self.k is None else self.k

    def q_at(self, b, q_idx):
        """Position of query index q_idx in sequence b: works on scalars inside a
        kernel and on index grids."""
        if self.q is None:
            return q_idx + (self.k_len - self.q_len)
        return self.q[q_idx] if self.q.ndim == 1 else self.q[b, q_idx]

    def k_at(self, b, kv_idx):
        if self.k is None:
            return kv_idx
        return self.k[kv_idx] if self.k.ndim == 1 else self.k[b, kv_idx]

    def same_document(self, b, q_idx, kv_idx):
        """Whether query q_idx and key kv_idx of sequence b belong to one document;
        None where nothing is packed."""
        if self.k_doc is None:
            return None
        q_doc = self.q_doc[q_idx] if self.q_doc.ndim == 1 else self.q_doc[b, q_idx]
        return q_doc == (
            self.k_doc[kv_idx] if self.k_doc.ndim == 1 else self.k_doc[b, kv_idx]
        )

    def distances(self, device) -> torch.Tensor:
        """k_pos - q_pos of every pair (j - i), broadcastable to
        (batch, heads, q_len, k_len)."""
        b, _, q_idx, kv_idx = index_grids(self.rows, 1, self.q_len, self.k_len, device)
        return self.k_at(b, kv_idx) - self.q_at(b, q_idx)

    def key(self):
        """A cache key for tables derived from these positions, or None where the
        positions are not the default."""
        return (self.q_len, self.k_len) if self.q is None else None


def _documents(
    q: torch.Tensor | None, k: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Document ids of queries and keys where the keys' positions restart (packed
    documents), else (None, None)."""
    k_doc = None if k is None else documents(k)
    if k_doc is None:
        return None, None
    q_len, k_len = q.shape[-1], k.shape[-1]
    if q_len > k_len or not bool((q == k[..., k_len - q_len :]).all()):
        raise ValueError(
            "k_positions start again from 0 (packed documents, each from a 0 on), "
            "so q_positions must be the "
            f"last q_len = {q_len} of k_positions, which gives each query its "
            f"document; got q_positions {q.tolist()} for k_positions {k.tolist()}. "
            "Pass queries and keys of one stream, or unpack the documents"
        )
    return k_doc[..., k_len - q_len :], k_doc


def index_grids(
    batch: int, heads: int, q_len: int, k_len: int, device
) -> tuple[torch.Tensor, ...]:
    """b, h, q_idx, kv_idx as broadcastable (batch,1,1,1), (1,heads,1,1),
    (1,1,q_len,1), (1,1,1,k_len) index tensors.

    A score_mod or mask_mod written for one (b, h, q_idx, kv_idx) of a kernel, evaluated
    on these grids, gives the whole dense table at once: how posenc derives the bias and
    mask of the explicit and sdpa backends from the one definition.
    """

    def grid(n, dim):
        shape = [1, 1, 1, 1]
        shape[dim] = n
        return torch.arange(n, device=device).view(shape)

    return grid(batch, 0), grid(heads, 1), grid(q_len, 2), grid(k_len, 3)
