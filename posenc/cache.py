"""A key/value cache for decoding, token by token or chunk by chunk; rolling for a
sliding window."""

from __future__ import annotations

import torch

from ._checks import as_positions
from .core import attention
from .positions import axis_inputs
from .scheme import NoPE, Scheme


class KVCache:
    """Keys (already through the scheme's query/key transform, as real decoders store
    them), values and their positions, for decoding with one scheme.

    Decoding chunk by chunk with `step` (or `append`, then `attend`) gives the outputs
    of one full pass of posenc.attention over the whole sequence, for every scheme.
    For a scheme with a window of W keys (SlidingWindow) the cache rolls: after each
    append of n entries it keeps the W - 1 entries before them and the n themselves,
    which is exactly what the chunk's queries can see, so memory stays O(W + n) however
    long the stream, and a prefill of any chunk size gives the outputs of one full pass.
    With attention sinks (``SlidingWindow(..., num_sinks=S)``) the entries at positions
    0..S-1 are kept as well (in every row that has them, with per-row positions). Each
    cached key keeps the position it was appended at: under RoPE a sink's key stays
    rotated by its original position, so the distance from a late query to a sink
    grows with the stream (StreamingLLM instead re-numbers positions inside the cache;
    posenc does not).

    A scheme with several position axes (M-RoPE, axial 2-D RoPE) takes each chunk's
    coordinates, (axes, n) or (axes, batch, n), beside its 1-D positions: the keys are
    rotated by the coordinates, and the cache keeps only the positions, which order the
    sequence for the mask (Qwen2-VL decodes text after an image this way: positions
    count tokens, coordinates restart from the image's largest id plus one).

    Args:
        scheme: the layer's scheme; None for NoPE. For a model's layers, one cache
            each: `for_layers`.

    Raises:
        TypeError: `scheme` is not a posenc Scheme (a list of them, for instance).

    Example:
        >>> import torch, posenc
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g)
        >>> rope = posenc.Rope(head_dim=8)
        >>> cache = posenc.KVCache(rope)
        >>> prefill = cache.step(q[:, :, :4], k[:, :, :4], v[:, :, :4], torch.arange(4))
        >>> steps = [
        ...     cache.step(q[:, :, [i]], k[:, :, [i]], v[:, :, [i]], torch.tensor([i]))
        ...     for i in (4, 5)
        ... ]
        >>> decoded = torch.cat([prefill, *steps], dim=2)
        >>> torch.testing.assert_close(decoded, posenc.attention(q, k, v, rope))
        >>> len(cache)
        6
        >>> rolling = posenc.KVCache(posenc.SlidingWindow(3, inner=rope))
        >>> for i in range(6):
        ...     out = rolling.step(q[:, :, [i]], k[:, :, [i]], v[:, :, [i]], [i])
        >>> len(rolling), rolling.positions.tolist()
        (3, [3, 4, 5])
    """

    def __init__(self, scheme: Scheme | None = None):
        self.scheme = NoPE() if scheme is None else scheme
        if not isinstance(self.scheme, Scheme):
            raise TypeError(
                "scheme must be a posenc Scheme or None, "
                f"got {type(scheme).__name__}: for a model's layers use "
                "KVCache.for_layers"
            )
        self.keys = self.values = self.positions = self.documents = None

    @classmethod
    def for_layers(cls, schemes) -> list[KVCache]:
        """One cache per layer of a model: rolling where the layer has a window, full
        elsewhere.

        Args:
            schemes: one scheme per layer, as posenc.layer_schemes or
                TinyTransformer.layer_schemes returns them.

        Returns:
            A list of KVCache, one per scheme, in order.

        Raises:
            TypeError: an entry is not a scheme (a layer type such as
                ``"linear_attention"``, which keeps a state of its own instead of keys
                and values); the message names the layer.

        Example:
            >>> import posenc
            >>> from posenc.score.masks import sliding_window
            >>> rope = posenc.Rope(head_dim=8)
            >>> layers = [posenc.Layer(rope, sliding_window(4)), rope]
            >>> [cache.scheme.window for cache in posenc.KVCache.for_layers(layers)]
            [4, None]
        """
        caches = []
        for i, scheme in enumerate(schemes):
            if not isinstance(scheme, Scheme):
                raise TypeError(
                    f"layer {i} is {scheme!r}, not an attention scheme: a KV cache "
                    "holds keys and values of softmax attention layers only"
                )
            caches.append(cls(scheme))
        return caches

    def __len__(self) -> int:
        return 0 if self.positions is None else self.positions.shape[-1]

    def append(
        self, k: torch.Tensor, v: torch.Tensor, positions, coords=None, documents=None
    ) -> None:
        """Add a chunk's keys and values; the keys go through the scheme's key transform
        first, and a rolling cache then drops what no later query can see.

        Args:
            k: keys, (batch, heads, n, head_dim), before the scheme's transform.
            v: values, (batch, heads, n, head_dim).
            positions: the chunk's positions, (n,) or (batch, n) integers (one shape
                for every append of a cache).
            coords: for a scheme with several position axes, coordinates (axes, n) or
                (axes, batch, n); None otherwise.
            documents: each entry's document in a packed stream, the shape of
                `positions` (posenc.attention's `k_documents`); at every append or
                never.

        Raises:
            ValueError: `k` and `v` are not (batch, heads, n, head_dim) with positions
                of shape (n,) or (batch, n); the positions change shape between
                appends; documents are given at some appends only; the scheme is on
                another device than `k`.
            TypeError: `positions` or `documents` are not integers.

        Example:
            >>> import torch, posenc
            >>> cache = posenc.KVCache(posenc.Rope(head_dim=8))
            >>> cache.append(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), [0, 1, 2])
            >>> cache.keys.shape, cache.positions.tolist()
            (torch.Size([1, 2, 3, 8]), [0, 1, 2])
        """
        p = as_positions("positions", positions, integer=True)
        p = p.reshape(-1) if p.ndim <= 1 else p
        if (
            k.ndim != 4
            or k.shape != v.shape[:3] + (k.shape[3],)
            or k.shape[2] != p.shape[-1]
            or (p.ndim == 2 and p.shape[0] != k.shape[0])
        ):
            raise ValueError(
                f"k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                "(batch, heads, n, head_dim) with positions of shape (n,) or "
                f"(batch, n); got positions {tuple(p.shape)}"
            )
        if self.positions is not None and p.ndim != self.positions.ndim:
            raise ValueError(
                "positions must keep one shape per cache: (n,) or (batch, n) "
                f"throughout, got {tuple(p.shape)} after "
                f"{tuple(self.positions.shape)}"
            )
        if (documents is None) != (
            self.documents is None
        ) and self.positions is not None:
            raise ValueError(
                "documents must be given at every append or at none: "
                "the cache's entries need one document each"
            )
        if documents is not None:
            documents = (
                as_positions("documents", documents, integer=True)
                .reshape(p.shape)
                .to(k.device)
            )
        self.scheme.check_device(k.device)
        c = axis_inputs(
            "coords", p, coords, self.scheme.position_axes, k.shape[2], k.shape[0]
        )
        k = self.scheme.transform_k(k, (p if c is None else c).to(k.device))
        if self.keys is None:
            self.keys, self.values, self.positions, self.documents = (
                k,
                v,
                p.to(k.device),
                documents,
            )
        else:
            self.keys, self.values = (
                torch.cat((self.keys, k), dim=2),
                torch.cat((self.values, v), dim=2),
            )
            self.positions = torch.cat(
                (self.positions, p.to(self.positions.device)), dim=-1
            )
            if documents is not None:
                self.documents = torch.cat((self.documents, documents), dim=-1)
        self._roll(k.shape[2])

    def _roll(self, appended: int) -> None:
        window, sinks = self.scheme.window, self.scheme.num_sinks
        if window is None:
            return
        recent = window - 1 + appended  # what the newest chunk's queries can still see
        if len(self) <= sinks + recent:
            return
        # positions 0..sinks-1, as in the mask
        is_sink = (self.positions >= 0) & (self.positions < sinks)
        # with per-row positions (left padding) a row's sink sits at its own index:
        # keep a slot any row needs, the mask hides it from the rows for which it is
        # neither a sink nor in the window
        is_sink = (is_sink.any(0) if is_sink.ndim == 2 else is_sink).to(
            self.keys.device
        )
        is_sink[len(self) - recent :] = False
        keep = torch.cat(
            (
                is_sink.nonzero().flatten(),
                torch.arange(len(self) - recent, len(self), device=self.keys.device),
            )
        )
        self.keys, self.values = (
            self.keys.index_select(2, keep),
            self.values.index_select(2, keep),
        )
        self.positions = self.positions.index_select(-1, keep.to(self.positions.device))
        if self.documents is not None:
            self.documents = self.documents.index_select(
                -1, keep.to(self.documents.device)
            )

    def attend(
        self, q: torch.Tensor, positions, coords=None, documents=None, **kwargs
    ) -> torch.Tensor:
        """Attention of a chunk's queries against everything cached (causal by default).

        The cached keys are already transformed, so this is posenc.attention with
        ``keys_transformed=True``.

        Args:
            q: queries, (batch, heads, n, head_dim).
            positions: the queries' positions, (n,) or (batch, n) integers.
            coords: for a scheme with several position axes, the queries' coordinates,
                (axes, n) or (axes, batch, n).
            documents: in a cache of packed documents, each query's document.
            **kwargs: passed to posenc.attention (``backend``, ``causal``, ``mask``,
                ``scale``, ...).

        Returns:
            The output, (batch, heads, n, head_dim) (or what posenc.attention returns
            for the keywords given).

        Raises:
            ValueError: the cache is empty; documents are given for the queries or for
                the cached entries only; and posenc.attention's errors.

        Example:
            >>> import torch, posenc
            >>> cache = posenc.KVCache()
            >>> cache.append(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), [0, 1, 2])
            >>> cache.attend(torch.ones(1, 2, 1, 8), [2]).shape
            torch.Size([1, 2, 1, 8])
        """
        if self.keys is None:
            raise ValueError("the cache is empty: append keys and values first")
        if (documents is None) != (self.documents is None):
            raise ValueError(
                "the cached entries have documents, so the queries need theirs"
                if documents is None
                else "documents were given for the queries "
                "but not for the cached entries"
            )
        p = as_positions("positions", positions, integer=True)
        p = p.reshape(-1) if p.ndim <= 1 else p
        docs = (
            {}
            if documents is None
            else {
                "q_documents": as_positions(
                    "documents", documents, integer=True
                ).reshape(p.shape),
                "k_documents": self.documents,
            }
        )
        return attention(
            q,
            self.keys,
            self.values,
            self.scheme,
            q_positions=p,
            k_positions=self.positions,
            q_coords=coords,
            keys_transformed=True,
            **docs,
            **kwargs,
        )

    def step(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions,
        coords=None,
        documents=None,
        **kwargs,
    ) -> torch.Tensor:
        """Append a chunk's keys and values, then attend with its queries: one decoding
        or prefill step.

        Args:
            q: the chunk's queries, (batch, heads, n, head_dim).
            k: its keys, (batch, heads, n, head_dim), before the scheme's transform.
            v: its values, (batch, heads, n, head_dim).
            positions: its positions, (n,) or (batch, n) integers.
            coords: coordinates for a scheme with several position axes.
            documents: each token's document in a packed stream.
            **kwargs: passed to posenc.attention.

        Returns:
            The chunk's output, (batch, heads, n, head_dim).

        Raises:
            ValueError: where `append` or `attend` raises it.
            TypeError: where `append` raises it.

        Example:
            >>> import torch, posenc
            >>> cache = posenc.KVCache(posenc.ALiBi(num_heads=2))
            >>> x = torch.ones(1, 2, 4, 8)
            >>> cache.step(x, x, x, torch.arange(4)).shape, len(cache)
            (torch.Size([1, 2, 4, 8]), 4)
        """
        self.append(k, v, positions, coords, documents)
        return self.attend(q, positions, coords, documents, **kwargs)
