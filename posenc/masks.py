"""Boolean attention masks: True where a query may attend to a key."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import as_positions, non_negative_int, positive_int
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


def window_mask_with_sinks(q_positions, k_positions, window: int, num_sinks: int) -> torch.Tensor:
    """(len(q), len(k)) boolean mask: the causal window of `window` keys plus the first `num_sinks` positions.

    True where key_position <= query_position and (query_position - window < key_position
    or key_position < num_sinks). The sinks are the first tokens of the stream (positions
    0..num_sinks-1), which StreamingLLM (Xiao et al., 2024) keeps visible to every later
    query; num_sinks=0 gives window_mask.
    """
    positive_int("window", window)
    non_negative_int("num_sinks", num_sinks)
    causal = causal_mask(q_positions, k_positions)
    k = as_positions("k_positions", k_positions, integer=True).to(causal.device)
    return window_mask(q_positions, k_positions, window) | (causal & (k < num_sinks)[None, :])


def window_mask_mod(window: int, num_sinks: int = 0, q_offset: int = 0) -> Callable:
    """The same mask as a FlexAttention mask_mod(b, h, q_idx, kv_idx), for create_block_mask.

    Keys are at positions kv_idx and queries at q_idx + q_offset (q_offset = k_len - q_len
    puts the queries at the last q_len positions, as sliding_window_mask does). It is a
    pure function of the indices, so a compiled kernel can skip every block of keys it
    rules out without ever materialising the mask.
    """
    positive_int("window", window)
    non_negative_int("num_sinks", num_sinks)
    non_negative_int("q_offset", q_offset)

    def sliding_window(b, h, q_idx, kv_idx):
        i = q_idx + q_offset
        visible = (kv_idx <= i) & (i - kv_idx < window)
        return visible | ((kv_idx <= i) & (kv_idx < num_sinks)) if num_sinks else visible

    return sliding_window
