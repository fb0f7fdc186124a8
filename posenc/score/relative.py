"""Relative positions with learned vectors: Shaw et al. (2018), and Transformer-XL's
relative logits (Dai et al., 2019).

The pure functions are the building blocks the chapter derives; `ShawRelative` is the
score scheme, whose key term is one definition (a score_mod that reads the queries) and
whose value term needs the attention weights (explicit backend only; from a fused
kernel's log-sum-exp, `shaw_value_term_from_lse` computes it without them).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import choice, positive_float, positive_int
from ..positions import default_positions, relative_distance
from ..scheme import Scheme, register


def shaw_relative_index(q_len: int, k_len: int, max_distance: int) -> torch.Tensor:
    """clip(j - i, -max_distance, max_distance) + max_distance, shape (q_len, k_len).

    Values in [0, 2 max_distance]. Keys are at 0..k_len-1 and the queries are the
    last q_len positions (as when decoding against a cache), the convention of
    posenc.attention. The index is int64 (what gather and scatter_add_ take): twice
    the bytes of float32 scores of the same shape, built in place so that it is the
    only (q_len, k_len) tensor held.
    """
    positive_int("q_len", q_len)
    positive_int("k_len", k_len)
    q_pos, k_pos = default_positions(q_len, k_len)
    return clipped_relative_index(q_pos, k_pos, max_distance)


def clipped_relative_index(q_positions, k_positions, max_distance: int) -> torch.Tensor:
    """shaw_relative_index for explicit positions: clip(k_pos - q_pos, -k, k) + k."""
    positive_int("max_distance", max_distance)
    distance = relative_distance(q_positions, k_positions)  # a new tensor: change it
    return distance.clamp_(-max_distance, max_distance).add_(max_distance)


METHODS = ("gather", "naive")


def shaw_key_scores(
    q: torch.Tensor, table: torch.Tensor, index: torch.Tensor, method: str = "gather"
) -> torch.Tensor:
    """q_i . a^K_{index[i, j]} for every query and key: (..., q_len, k_len).

    q is (..., q_len, d); table (2k + 1, d); index (q_len, k_len), or broadcastable
    to the scores.
    "naive" builds the (q_len, k_len, d) tensor of relative embeddings, as the
    paper's equations read; "gather" multiplies q by the 2k + 1 table rows once
    and gathers, so beside the index it reads it holds the scores and a
    (q_len, 2k + 1) matrix only.
    """
    choice("method", method, METHODS)
    if method == "naive":
        return torch.einsum("...qd,qkd->...qk", q, table[index])
    per_row = q @ table.T
    return per_row.gather(-1, index.expand(*per_row.shape[:-1], index.shape[-1]))


def shaw_value_term(
    weights: torch.Tensor,
    table: torch.Tensor,
    index: torch.Tensor,
    method: str = "gather",
) -> torch.Tensor:
    """sum_j weights_ij a^V_{index[i, j]}: (..., q_len, d), the relative term Shaw et
    al. add to the values.

    "naive" builds the (q_len, k_len, d) tensor; "gather" first sums the weights
    that share a relative index (a scatter-add into 2k + 1 slots), then multiplies
    by the table once.
    """
    choice("method", method, METHODS)
    if method == "naive":
        return torch.einsum(
            "...qk,...qkd->...qd", weights, table[index].to(weights.dtype)
        )
    slots = weights.new_zeros(*weights.shape[:-1], table.shape[0])
    slots.scatter_add_(-1, index.expand_as(weights), weights)
    return slots @ table.to(weights.dtype)


def shaw_value_term_from_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    key_table: torch.Tensor,
    value_table: torch.Tensor,
    scale: float,
    causal: bool = True,
    far_left: torch.Tensor | None = None,
) -> torch.Tensor:
    """Shaw et al.'s value term from a fused kernel's log-sum-exp: (..., q_len, d).

    q is (..., q_len, d) and k (..., k_len, d), the queries at the last q_len of the
    k_len key positions; lse (..., q_len) is each query's natural log-sum-exp of its
    scores (key term included), as FlexAttention (return_aux=AuxRequest(lse=True))
    and FlashAttention (softmax_lse) return it. The weight of key j is then
    exp(s_ij - lse_i). Only the 2k + 1 keys with |j - i| <= k have a row of their
    own, and their scores are recomputed, q_i . (k_j + w^K_{j-i}) * scale, one
    offset at a time: O(q_len k d) work, nothing of size (q_len, k_len). Every key
    further back shares the edge row w^V_{-k}, every key further ahead w^V_{k}, so
    only their total weights count. With `causal`, the keys ahead have none and the
    keys behind have the rest: 1 minus the band's weight. Without it, `far_left`
    (..., q_len) is the weight on the keys with j - i < -k (one more fused pass,
    masked to those keys, gives it as exp(lse_left - lse)), and the keys ahead have
    the rest. Each query's weights must sum to 1 (no sink, no fully masked row).
    """
    if not causal and far_left is None:
        raise ValueError(
            "without a causal mask the keys past both edges of the band share two "
            "rows: pass far_left, the weight on the keys with j - i < -k (for "
            "instance exp(lse_left - lse) from a second pass masked to those keys)"
        )
    max_distance = (key_table.shape[0] - 1) // 2
    q_len, k_len = q.shape[-2], k.shape[-2]
    q, k, lse = q.float(), k.float(), lse.float()
    query_at = torch.arange(k_len - q_len, k_len, device=q.device)
    band = q.new_zeros(*lse.shape, 2 * max_distance + 1)  # (..., q_len, 2k + 1)
    for row, offset in enumerate(range(-max_distance, max_distance + 1)):
        if causal and offset > 0:
            break  # keys after the query are masked: weight 0
        key_at = query_at + offset
        inside = (key_at >= 0) & (key_at < k_len)
        keys = k[..., key_at.clamp(0, k_len - 1), :]  # a copy: k_j of each query
        score = (q * keys.add_(key_table[row].float())).sum(-1) * scale
        band[..., row] = torch.where(inside, torch.exp(score - lse), 0.0)
    far = 1 - band.sum(-1)  # the weight on the keys past the band, both sides
    if causal:
        band[..., 0] += far
    else:
        band[..., 0] += far_left.float()
        band[..., -1] += far - far_left.float()
    return band @ value_table.float()


def skew(rel_scores: torch.Tensor) -> torch.Tensor:
    """Music Transformer's skewing (Huang et al., 2019): from q_i . r_{d} to
    q_i . r_{j - i}, with no gather and no index.

    rel_scores is (..., L, L) whose column c holds the score against the
    relative embedding of distance c - (L - 1), i.e. from -(L - 1) to 0. The
    result S has S[i, j] = rel_scores[i, j - i + L - 1] for j <= i (the causal
    part; entries with j > i are meaningless and must be masked). Pad one column,
    reshape, drop a row: Transformer-XL's `_rel_shift` is the same trick.
    """
    length = rel_scores.shape[-1]
    if rel_scores.shape[-2] != length:
        raise ValueError(
            "rel_scores must be square in its last two dimensions, "
            f"got {tuple(rel_scores.shape)}"
        )
    padded = torch.nn.functional.pad(rel_scores, (1, 0))
    return padded.reshape(*rel_scores.shape[:-2], length + 1, length)[..., 1:, :]


def transformer_xl_logits(
    q: torch.Tensor, k: torch.Tensor, r: torch.Tensor, u: torch.Tensor, v: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The four terms of Transformer-XL's relative logit (Dai et al., 2019, section
    3.3), each (..., L, L).

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
        raise ValueError(
            f"r must hold one row per distance 0..{length - 1}, got {r.shape[-2]} rows"
        )
    # row c of r is distance L - 1 - c, i.e. offset j - i = c - (L - 1): the column
    # order skew expects
    return {
        "a": q @ k.transpose(-1, -2),
        "b": skew(q @ r.T),
        "c": (u @ k.transpose(-1, -2)).unsqueeze(-2).expand(*q.shape[:-1], length),
        "d": skew((v @ r.T).expand(*q.shape[:-1], length)),
    }


@register
class ShawRelative(Scheme):
    """Learned relative keys and values per clipped distance clip(j - i, -k, k)
    (Shaw et al., 2018).

    logit_ij += q_i . a^K_ij / sqrt(head_dim) and output_i += sum_j weights_ij a^V_ij,
    with one table of 2k + 1 rows for keys and one for values, shared by the heads.
    `values=False` keeps only the key term, which every backend can run; the value
    term needs the weights, so only the explicit backend runs it, by `method`: the
    naive (q_len, k_len, head_dim) construction or the memory-efficient scatter.
    `method` concerns the value term only: the key term is always query_score_mod.
    The tables are parameters (`key_table`, `value_table`), one pair per layer.
    Registered as ``"shaw"``.

    Args:
        head_dim: the width of a head (of queries, keys and values).
        max_distance: k, the largest distance with a row of its own; keys farther
            away share the edge rows.
        values: also learn the value table (explicit backend only).
        method: ``"gather"`` or ``"naive"``, how the value term is computed.
        init_std: the standard deviation of the tables' normal initialisation.

    Raises:
        TypeError: `head_dim` or `max_distance` is not an integer.
        ValueError: `head_dim` or `max_distance` < 1, `method` is unknown, or
            `init_std` <= 0; on use, a backend other than ``"explicit"`` with
            ``values=True``.

    Example:
        >>> import torch, posenc
        >>> shaw = posenc.ShawRelative(head_dim=8, max_distance=2)
        >>> shaw.key_table.shape, shaw.value_table.shape  # 2k + 1 rows
        (torch.Size([5, 8]), torch.Size([5, 8]))
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g)
        >>> posenc.attention(q, k, v, shaw).shape
        torch.Size([1, 2, 6, 8])
        >>> posenc.attention(q, k, v, shaw, backend="sdpa")
        Traceback (most recent call last):
        ...
        ValueError: scheme 'shaw' adds a value term computed from the attention ...
        >>> keys_only = posenc.ShawRelative(8, max_distance=2, values=False)
        >>> sdpa = posenc.attention(q, k, v, keys_only, backend="sdpa")
        >>> torch.testing.assert_close(sdpa, posenc.attention(q, k, v, keys_only))
    """

    name = "shaw"
    hook = "score"
    bias_is_constant = False
    per_layer = True

    def __init__(
        self,
        head_dim: int,
        max_distance: int = 16,
        values: bool = True,
        method: str = "gather",
        init_std: float = 0.02,
    ):
        super().__init__()
        self.head_dim = positive_int("head_dim", head_dim)
        self.max_distance = positive_int("max_distance", max_distance)
        self.method = choice("method", method, METHODS)
        std = positive_float("init_std", init_std)
        self.key_table = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * std)
        self.value_table = (
            nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * std)
            if values
            else None
        )
        self.needs_weights = values

    def query_score_mod(self, q, positions):
        """q_i . a^K_{clip(j - i)} / sqrt(d): the queries meet the 2k + 1 table rows
        once, then each pair picks its row."""
        per_row = (q.float() @ self.key_table.float().T) / math.sqrt(
            self.head_dim
        )  # (batch, heads, q_len, 2k + 1)
        k = self.max_distance

        def shaw_keys(score, b, h, q_idx, kv_idx):
            index = (positions.k_at(b, kv_idx) - positions.q_at(b, q_idx)).clamp(
                -k, k
            ) + k
            return score + per_row[b, h, q_idx, index]

        return shaw_keys

    def value_term(self, weights, positions) -> torch.Tensor | None:
        if self.value_table is None:
            return None
        k = self.max_distance
        # distances() returns a new tensor: clip and shift it in place, so that the
        # int64 index is the only (q_len, k_len) tensor it adds
        index = positions.distances(weights.device).clamp_(-k, k).add_(k)
        return shaw_value_term(weights, self.value_table, index, self.method)

    def extra_repr(self) -> str:
        values = self.value_table is not None
        return (
            f"head_dim={self.head_dim}, max_distance={self.max_distance}, "
            f"values={values}, method={self.method!r}"
        )
