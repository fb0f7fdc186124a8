"""From a scheme's one definition to what each backend runs.

A scheme states its bias once as score_mod(score, b, h, q_pos, k_pos) and its mask
once as mask_mod(b, h, q_pos, k_pos), over positions. Here they become:

* index-space functions of (b, h, q_idx, kv_idx), FlexAttention's form, through the
  call's positions (in the default layout a position is the index plus a constant,
  so the function stays pure and compiles to arithmetic);
* dense tables, by evaluating the same function on broadcast index grids: the bias
  (batch or 1, heads, q_len, k_len) and the boolean mask the explicit and sdpa
  backends need; cached per shape, device and dtype where they depend on no
  learned parameter and the layout is the default;
* FlexAttention block masks, built once per shape with B=H=None and cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from ._checks import as_positions
from .positions import Positions, index_grids
from .scheme import MaskMod, Scheme, ScoreMod
from .score.masks import and_masks, causal as causal_mod

# dense masks and block masks of the default layout, by what defines them
_MASKS: OrderedDict = OrderedDict()
_MASKS_KEPT = 8


def kept(key, make: Callable[[], object]):
    """A table that depends on no learned parameter (a mask, a block mask), made once
    for `key` and kept for the last few keys."""
    if key not in _MASKS:
        while len(_MASKS) >= _MASKS_KEPT:
            _MASKS.popitem(last=False)
        _MASKS[key] = make()
    _MASKS.move_to_end(key)
    return _MASKS[key]


def index_score_mod(
    scheme: Scheme, positions: Positions, q: torch.Tensor
) -> ScoreMod | None:
    """The scheme's bias as FlexAttention's score_mod(score, b, h, q_idx, kv_idx), or
    None where it has none."""
    reads_queries = scheme.query_score_mod(q, positions)
    if reads_queries is not None:
        return reads_queries
    mod = scheme.score_mod
    if mod is None:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        return mod(score, b, h, positions.q_at(b, q_idx), positions.k_at(b, kv_idx))

    return score_mod


def index_mask_mod(
    scheme: Scheme, positions: Positions, causal: bool
) -> MaskMod | None:
    """Causal, the scheme's mask and packed documents, combined, as FlexAttention's
    mask_mod(b, h, q_idx, kv_idx); None: every key."""
    mods = ([causal_mod] if causal else []) + (
        [scheme.mask_mod] if scheme.mask_mod is not None else []
    )
    if not mods and positions.k_doc is None:
        return None
    mod = and_masks(*mods) if mods else None

    def mask_mod(b, h, q_idx, kv_idx):
        same = positions.same_document(b, q_idx, kv_idx)
        if mod is None:
            return same
        allowed = mod(b, h, positions.q_at(b, q_idx), positions.k_at(b, kv_idx))
        return allowed if same is None else allowed & same

    return mask_mod


def mask_rows(scheme: Scheme, positions: Positions) -> int:
    """How many sequences the mask tells apart: the batch where positions or the
    scheme's mask differ per row, else 1."""
    return max(positions.rows, scheme.mask_rows or 1)


def _mask_key(
    scheme: Scheme, positions: Positions, causal: bool, device
) -> tuple | None:
    layout = positions.key()
    return (
        None
        if layout is None
        else (causal, scheme.mask_key(), layout, torch.device(device))
    )


def bias_table(
    scheme: Scheme, positions: Positions, q: torch.Tensor
) -> torch.Tensor | None:
    """The dense float32 bias, broadcastable to (batch, heads, q_len, k_len), or None:
    the one definition on index grids."""
    batch, heads = q.shape[0], q.shape[1]

    def evaluate():
        mod = index_score_mod(scheme, positions, q)
        if mod is None:
            return None
        b, h, q_idx, kv_idx = index_grids(
            batch, heads, positions.q_len, positions.k_len, q.device
        )
        zero = torch.zeros((), dtype=torch.float32, device=q.device)
        return mod(zero, b, h, q_idx, kv_idx).float()

    constant = (
        scheme.bias_is_constant
        and scheme.score_mod is not None
        and positions.key() is not None
    )
    if not constant:
        return evaluate()
    return scheme.cached(("bias", positions.key(), heads, q.device), evaluate)


def mask_table(
    scheme: Scheme, positions: Positions, causal: bool, device
) -> torch.Tensor | None:
    """The dense boolean mask, (batch or 1, 1, q_len, k_len), True where a query may
    attend; None: every key."""

    def evaluate():
        mod = index_mask_mod(scheme, positions, causal)
        if mod is None:
            return None
        rows = mask_rows(scheme, positions)
        b, h, q_idx, kv_idx = index_grids(
            rows, 1, positions.q_len, positions.k_len, device
        )
        return mod(b, h, q_idx, kv_idx).expand(
            rows, 1, positions.q_len, positions.k_len
        )

    key = _mask_key(scheme, positions, causal, device)
    return evaluate() if key is None else kept(("dense",) + key, evaluate)


def block_mask(
    scheme: Scheme,
    positions: Positions,
    causal: bool,
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
):
    """FlexAttention's BlockMask for the call, or None where every key is visible.

    In the default layout, without a user mask, it is built once per (shape, device,
    mask) with B=H=None and cached; otherwise it is built for the call.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    mod = index_mask_mod(scheme, positions, causal)
    batch, q_len, k_len = q.shape[0], q.shape[2], k.shape[2]
    if mask is not None:
        full = mask.to(q.device).expand(batch, q.shape[1], q_len, k_len)

        def given(b, h, q_idx, kv_idx):
            return full[b, h, q_idx, kv_idx]

        with_given = given if mod is None else and_masks(mod, given)
        return create_block_mask(
            with_given, batch, q.shape[1], q_len, k_len, device=q.device.type
        )
    if mod is None:
        return None
    rows = batch if mask_rows(scheme, positions) > 1 else None
    key = _mask_key(scheme, positions, causal, q.device)

    def build():
        return create_block_mask(mod, rows, None, q_len, k_len, device=q.device.type)

    return build() if key is None else kept(("block",) + key, build)


def bias_matrix(
    scheme: Scheme,
    q_positions,
    k_positions,
    num_heads: int | None = None,
    q: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The dense bias a score scheme adds for explicit 1-D positions:
    (num_heads, len(q), len(k)), or None.

    The same evaluation of the one definition that posenc.attention uses, on the
    device of the scheme's tables. The head count is `num_heads`, else the scheme's own
    `num_heads`, else 1. For a scheme whose bias reads the queries (Shaw), pass q
    (batch, heads, q_len, head_dim) and get (batch or 1, heads, q_len, k_len).
    """
    heads = (
        num_heads
        or getattr(scheme, "num_heads", None)
        or getattr(getattr(scheme, "inner", None), "num_heads", None)
        or 1
    )
    q_pos, k_pos = (
        as_positions("q_positions", q_positions, integer=True),
        as_positions("k_positions", k_positions, integer=True),
    )
    if q_pos.ndim != 1 or k_pos.ndim != 1:
        raise ValueError(
            "bias_matrix takes 1-D positions, (len(q),) and (len(k),); "
            f"got q_positions {tuple(q_pos.shape)} and k_positions "
            f"{tuple(k_pos.shape)}: for per-row positions (batch, L) call it once per "
            "row, or posenc.attention with backend='explicit' and return_weights=True"
        )
    # where the scheme's tables live
    device = next(
        iter([*scheme.parameters(), *scheme.buffers()]), torch.zeros(())
    ).device
    like = torch.zeros(1, heads, len(q_pos), 1, device=device) if q is None else q
    positions = Positions.resolve(
        q_pos, k_pos, len(q_pos), len(k_pos), like.shape[0], like.device
    )
    table = bias_table(scheme, positions, like)
    if table is None:
        return None
    return (
        table.expand(like.shape[0], like.shape[1], len(q_pos), len(k_pos))[0]
        if q is None
        else table
    )


def additive_mask(bias, allowed, dtype) -> torch.Tensor | None:
    """The bias with -inf where a key is masked, in the queries' dtype: the one additive
    mask of the sdpa backend; None where there is neither a bias nor a mask."""
    if allowed is None:
        return None if bias is None else bias.to(dtype)
    return torch.where(
        allowed,
        torch.zeros((), dtype=torch.float32, device=allowed.device)
        if bias is None
        else bias,
        float("-inf"),
    ).to(dtype)
