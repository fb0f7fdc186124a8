"""A key/value cache for decoding one token at a time, optionally rolling (a sliding window)."""

from __future__ import annotations

import torch

from ._checks import as_positions, positive_int
from .attention import attention
from .schemes import NoPE, Scheme


class KVCache:
    """Keys (already through the scheme's query/key transform, as real decoders store them), values, positions.

    With `window=W` it keeps only the last W entries: a rolling cache whose
    memory stays O(W) however long the sequence, for sliding-window attention.
    """

    def __init__(self, scheme: Scheme | None = None, window: int | None = None):
        self.scheme = NoPE() if scheme is None else scheme
        self.window = None if window is None else positive_int("window", window)
        self.keys = self.values = None
        self.positions = torch.zeros(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, k: torch.Tensor, v: torch.Tensor, positions) -> None:
        """Add keys and values (batch, heads, n, head_dim) at `positions` (n,)."""
        p = as_positions("positions", positions, integer=True).reshape(-1)
        if k.ndim != 4 or k.shape != v.shape[:3] + (k.shape[3],) or k.shape[2] != len(p):
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be (batch, heads, n, head_dim) with n = len(positions) = {len(p)}")
        k = self.scheme.transform_qk(k, p)
        self.keys = k if self.keys is None else torch.cat((self.keys, k), dim=2)
        self.values = v if self.values is None else torch.cat((self.values, v), dim=2)
        self.positions = torch.cat((self.positions, p.to(self.positions.device)))
        if self.window is not None and len(self.positions) > self.window:
            self.keys, self.values = self.keys[:, :, -self.window :], self.values[:, :, -self.window :]
            self.positions = self.positions[-self.window :]

    def attend(self, q: torch.Tensor, positions, **kwargs) -> torch.Tensor:
        """Attention of queries at `positions` against everything cached (causal by default)."""
        if self.keys is None:
            raise ValueError("the cache is empty: append keys and values first")
        p = as_positions("positions", positions, integer=True).reshape(-1)
        return attention(q, self.keys, self.values, self.scheme, q_positions=p, k_positions=self.positions, keys_transformed=True, **kwargs)
