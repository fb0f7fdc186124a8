"""Learned relative positions: Shaw et al. (2018), T5's buckets (Raffel et al., 2020), Transformer-XL (Dai et al., 2019).

The pure functions here are the building blocks; the schemes in posenc.schemes
(ShawRelative, T5Bias) wrap them as score hooks.
"""

from __future__ import annotations

import math

import torch

from ._checks import as_positions, choice, positive_int
from .alibi import relative_distance
from .masks import default_positions


def t5_relative_bucket(relative_position, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket of each relative position (key_position - query_position), as in Hugging Face's T5Attention.

    Half the buckets of a direction hold the distances 0, 1, 2, ... exactly; the
    other half cover the distances up to `max_distance` on a log scale, and every
    distance beyond it shares the last bucket. `bidirectional=True` (encoder)
    gives keys after the query their own half of the buckets; `False` (decoder)
    maps every key after the query to bucket 0 with distance 0.
    """
    positive_int("num_buckets", num_buckets, even="bidirectional buckets are split between keys before and after the query" if bidirectional else None)
    positive_int("max_distance", max_distance)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    if max_exact < 1:
        raise ValueError(f"num_buckets must be at least {4 if bidirectional else 2} (bidirectional={bidirectional}), got {num_buckets}")
    if max_distance <= max_exact:
        raise ValueError(f"max_distance must exceed the {max_exact} exact buckets (num_buckets={num_buckets}, bidirectional={bidirectional}), got {max_distance}")
    rel = as_positions("relative_position", relative_position, integer=True).long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        buckets = buckets + (rel > 0).long() * per_direction
        distance = rel.abs()
    else:
        distance = (-rel).clamp(min=0)
    is_small = distance < max_exact
    # float32 on purpose: the same rounding as the reference, so that every input gets the same bucket
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (per_direction - max_exact)).long()).clamp(max=per_direction - 1)
    return buckets + torch.where(is_small, distance, large)


def shaw_relative_index(q_len: int, k_len: int, max_distance: int) -> torch.Tensor:
    """clip(j - i, -max_distance, max_distance) + max_distance, shape (q_len, k_len), values in [0, 2 max_distance].

    Keys are at 0..k_len-1 and the queries are the last q_len positions (as when
    decoding against a cache), the convention of posenc.attention.
    """
    positive_int("q_len", q_len)
    positive_int("k_len", k_len)
    q_pos, k_pos = default_positions(q_len, k_len)
    return clipped_relative_index(q_pos, k_pos, max_distance)


def clipped_relative_index(q_positions, k_positions, max_distance: int) -> torch.Tensor:
    """shaw_relative_index for explicit positions: clip(k_pos - q_pos, -k, k) + k."""
    positive_int("max_distance", max_distance)
    return relative_distance(q_positions, k_positions).clamp(-max_distance, max_distance) + max_distance


METHODS = ("gather", "naive")


def shaw_key_scores(q: torch.Tensor, table: torch.Tensor, index: torch.Tensor, method: str = "gather") -> torch.Tensor:
    """q_i . a^K_{index[i, j]} for every query and key: (..., q_len, k_len).

    q is (..., q_len, d); table (2k + 1, d); index (q_len, k_len).
    "naive" builds the (q_len, k_len, d) tensor of relative embeddings, as the
    paper's equations read; "gather" multiplies q by the 2k + 1 table rows once
    and gathers, so its memory is that of the scores alone.
    """
    choice("method", method, METHODS)
    if method == "naive":
        return torch.einsum("...qd,qkd->...qk", q, table[index])
    per_row = q @ table.T
    return per_row.gather(-1, index.expand(*per_row.shape[:-1], index.shape[-1]))


def shaw_value_term(weights: torch.Tensor, table: torch.Tensor, index: torch.Tensor, method: str = "gather") -> torch.Tensor:
    """sum_j weights_ij a^V_{index[i, j]}: (..., q_len, d), the relative term Shaw et al. add to the values.

    "naive" builds the (q_len, k_len, d) tensor; "gather" first sums the weights
    that share a relative index (a scatter-add into 2k + 1 slots), then multiplies
    by the table once.
    """
    choice("method", method, METHODS)
    if method == "naive":
        return torch.einsum("...qk,qkd->...qd", weights, table[index].to(weights.dtype))
    slots = weights.new_zeros(*weights.shape[:-1], table.shape[0])
    slots.scatter_add_(-1, index.expand_as(weights), weights)
    return slots @ table.to(weights.dtype)


def skew(rel_scores: torch.Tensor) -> torch.Tensor:
    """Music Transformer's skewing (Huang et al., 2019): from q_i . r_{d} to q_i . r_{j - i}, with no gather.

    rel_scores is (..., L, L) whose column c holds the score against the
    relative embedding of distance c - (L - 1), i.e. from -(L - 1) to 0. The
    result S has S[i, j] = rel_scores[i, j - i + L - 1] for j <= i (the causal
    part; entries with j > i are meaningless and must be masked). Pad one column,
    reshape, drop a row: Transformer-XL's `_rel_shift` is the same trick.
    """
    length = rel_scores.shape[-1]
    if rel_scores.shape[-2] != length:
        raise ValueError(f"rel_scores must be square in its last two dimensions, got {tuple(rel_scores.shape)}")
    padded = torch.nn.functional.pad(rel_scores, (1, 0))
    return padded.reshape(*rel_scores.shape[:-2], length + 1, length)[..., 1:, :]


def transformer_xl_logits(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four terms of Transformer-XL's relative logit (Dai et al., 2019, section 3.3), each (..., L, L).

    q and k are (..., L, d) projected queries and keys; r is (L, d), the projected
    relative embedding of distance i - j = L - 1 - c in row c (distances L-1 down
    to 0, the order of the paper's code); u and v are (d,) or broadcastable learned
    biases. With S[i, j] for the key j <= i:

        (a) q_i . k_j           content-content
        (b) q_i . r_{i-j}       content-position
        (c) u . k_j             global content bias
        (d) v . r_{i-j}         global position bias

    Terms (b) and (d) are computed for every distance and skewed into place.
    """
    length = q.shape[-2]
    if r.shape[-2] != length:
        raise ValueError(f"r must hold one row per distance 0..{length - 1}, got {r.shape[-2]} rows")
    # row c of r is distance L - 1 - c, i.e. offset j - i = c - (L - 1): the column order skew expects
    return {
        "a": q @ k.transpose(-1, -2),
        "b": skew(q @ r.T),
        "c": (u @ k.transpose(-1, -2)).unsqueeze(-2).expand(*q.shape[:-1], length),
        "d": skew((v @ r.T).expand(*q.shape[:-1], length)),
    }
