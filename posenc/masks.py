"""Boolean attention masks: True where a query may attend to a key."""

from __future__ import annotations

import torch

from .alibi import relative_distance


def causal_mask(q_positions, k_positions) -> torch.Tensor:
    """(len(q), len(k)) boolean mask, True where key_position <= query_position."""
    return relative_distance(q_positions, k_positions) <= 0
