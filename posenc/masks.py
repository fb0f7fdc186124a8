"""Boolean attention masks: True where a query may attend to a key."""

from __future__ import annotations

import torch

from ._checks import positive_int
from .alibi import relative_distance


def causal_mask(q_positions, k_positions) -> torch.Tensor:
    """(len(q), len(k)) boolean mask, True where key_position <= query_position."""
    return relative_distance(q_positions, k_positions) <= 0


def default_positions(q_len: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys at 0..k_len-1 and queries at the last q_len of them (decoding against a cache)."""
    if q_len > k_len:
        raise ValueError(f"without explicit positions q_len ({q_len}) must not exceed k_len ({k_len})")
    return torch.arange(k_len - q_len, k_len), torch.arange(k_len)


def window_mask(q_positions, k_positions, window: int) -> torch.Tensor:
    """(len(q), len(k)) boolean mask, True where query_position - window < key_position <= query_position.

    A window of W keys includes the query itself (Hugging Face's convention):
    with window=1 a token sees only itself.
    """
    positive_int("window", window)
    distance = -relative_distance(q_positions, k_positions)  # query_position - key_position
    return (distance >= 0) & (distance < window)


def sliding_window_mask(q_len: int, k_len: int, window: int) -> torch.Tensor:
    """Causal sliding-window mask of shape (q_len, k_len); the queries are the last q_len positions.

    True where i - window < j <= i, as Hugging Face's sliding-window causal mask.
    """
    positive_int("q_len", q_len)
    positive_int("k_len", k_len)
    q_pos, k_pos = default_positions(q_len, k_len)
    return window_mask(q_pos, k_pos, window)
