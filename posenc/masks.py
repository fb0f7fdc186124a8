"""Boolean attention masks: True where a query may attend to a key."""

from __future__ import annotations

import torch

from .alibi import relative_distance


def causal_mask(q_positions, k_positions) -> torch.Tensor:
    """(len(q), len(k)) boolean mask, True where key_position <= query_position."""
    return relative_distance(q_positions, k_positions) <= 0


def default_positions(q_len: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys at 0..k_len-1 and queries at the last q_len of them (decoding against a cache)."""
    if q_len > k_len:
        raise ValueError(f"without explicit positions q_len ({q_len}) must not exceed k_len ({k_len})")
    return torch.arange(k_len - q_len, k_len), torch.arange(k_len)
