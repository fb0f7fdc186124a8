"""Masks as FlexAttention mask_mods over positions, and the schemes that carry them.

A mask_mod(b, h, q_pos, k_pos) says whether the query at q_pos may attend to the key
at k_pos (True: it may). Each mask is written once, for one pair; `and_masks` and
`or_masks` combine them, as attention-gym does. `mask_matrix` evaluates one on two
lists of positions (what the chapters print and plot); posenc.kernel.mask_table
evaluates the same function, combined with the causal mask, on index grids (the dense
boolean mask the explicit and sdpa backends use), and posenc.attention turns it into
FlexAttention's block mask.

The masks models ship, each a `Mask` (a mask_mod with what identifies it):

* `sliding_window(W)`: the causal window of W keys (Mistral, Gemma's local layers),
  with sinks;
* `chunked(C)`: the sequence cut into chunks of C positions, each seeing only itself
  (Llama 4's local layers; causal inside a chunk under posenc.attention's causal mask);
* `bidirectional_window(R)`: the keys within R positions on either side (Longformer's
  and ModernBERT's local attention, for encoders: run with causal=False);
* `prefix_lm(P)`: the first P positions see each other both ways, the rest is causal
  (PaliGemma's image and prompt, T5-style prefix LMs);
* `causal_with_blocks(ids)`: causal, and tokens of one block see each other both ways
  (Gemma 3's image tokens).

The last two let a query see later keys, so the causal mask must not be ANDed over them:
`Masked` says so (`sees_later_keys`) and posenc.attention asks for causal=False.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from .._checks import as_positions, non_negative_int, positive_int
from ..layer import Layer
from ..scheme import MaskMod, Scheme, register


def causal(b, h, q_pos, k_pos):
    """A key is visible when it is not after the query: k_pos <= q_pos."""
    return k_pos <= q_pos


@dataclass(frozen=True, eq=False)
class Mask:
    """A mask_mod over positions, with the key that identifies it.

    Block masks and dense masks are cached by the key.

    `sees_later_keys`: the mask lets some query see a key after it, so it states
    causality itself and is not combined with the causal mask. `rows`: the batch size of
    a mask that differs between sequences (per-row block ids), else None. `window` and
    `num_sinks`: the keys a causal window keeps and the sink positions beside it, which
    a KV cache needs to roll (None and 0 for other masks).
    """

    mod: MaskMod
    key: Hashable
    sees_later_keys: bool = False
    rows: int | None = None
    window: int | None = None
    num_sinks: int = 0

    def __call__(self, b, h, q_pos, k_pos):
        return self.mod(b, h, q_pos, k_pos)


def sliding_window(window: int, num_sinks: int = 0) -> Mask:
    """The causal window of `window` keys, the query itself included.

    A key is visible when q_pos - window < k_pos <= q_pos.

    With `num_sinks` > 0 the first positions 0..num_sinks-1 (never a negative one,
    such as left padding's) stay visible to every later query as well (the attention
    sinks of StreamingLLM, Xiao et al., 2024). A window of W keys includes the query
    (Hugging Face's convention): window=1 sees only itself.

    Args:
        window: W, the keys each query sees, itself included.
        num_sinks: the first positions every later query sees as well, at most W.

    Returns:
        A `Mask` whose ``window`` and ``num_sinks`` a KV cache reads to roll.

    Raises:
        TypeError: `window` or `num_sinks` is not an integer.
        ValueError: `window` < 1, `num_sinks` < 0, or `num_sinks` > `window`.

    Example:
        >>> from posenc.score.masks import mask_matrix, sliding_window
        >>> mask_matrix(sliding_window(3), range(5), range(5)).int().tolist()
        [[1, 0, 0, 0, 0],
         [1, 1, 0, 0, 0],
         [1, 1, 1, 0, 0],
         [0, 1, 1, 1, 0],
         [0, 0, 1, 1, 1]]
        >>> with_sink = sliding_window(2, num_sinks=1)
        >>> mask_matrix(with_sink, range(5), range(5)).int().tolist()
        [[1, 0, 0, 0, 0],
         [1, 1, 0, 0, 0],
         [1, 1, 1, 0, 0],
         [1, 0, 1, 1, 0],
         [1, 0, 0, 1, 1]]
    """
    positive_int("window", window)
    if non_negative_int("num_sinks", num_sinks) > window:
        raise ValueError(
            "num_sinks must not exceed the window: "
            f"got num_sinks={num_sinks}, window={window}"
        )

    def window_mod(b, h, q_pos, k_pos):
        return (k_pos <= q_pos) & (q_pos - k_pos < window)

    def sinks_mod(b, h, q_pos, k_pos):
        return (k_pos <= q_pos) & (k_pos >= 0) & (k_pos < num_sinks)

    mod = or_masks(window_mod, sinks_mod) if num_sinks else window_mod
    key = ("sliding_window", window, num_sinks)
    return Mask(mod, key, window=window, num_sinks=num_sinks)


def chunked(chunk_size: int) -> Mask:
    """Chunks of `chunk_size` positions, each seeing only itself.

    A key is visible when q_pos // chunk_size == k_pos // chunk_size. Chunks start at
    position 0, so left padding (negative positions) falls in chunks of its own. Under
    a causal mask this is Llama 4's chunked attention (attention_chunk_size).

    Args:
        chunk_size: C, the positions in a chunk.

    Returns:
        A `Mask`; use it with `Masked` (or posenc.Layer).

    Raises:
        TypeError: `chunk_size` is not an integer.
        ValueError: `chunk_size` < 1.

    Example:
        >>> from posenc.score.masks import chunked, mask_matrix
        >>> mask_matrix(chunked(2), range(5), range(5)).int().tolist()
        [[1, 1, 0, 0, 0],
         [1, 1, 0, 0, 0],
         [0, 0, 1, 1, 0],
         [0, 0, 1, 1, 0],
         [0, 0, 0, 0, 1]]
    """
    positive_int("chunk_size", chunk_size)

    def same_chunk(b, h, q_pos, k_pos):
        return torch.div(q_pos, chunk_size, rounding_mode="floor") == torch.div(
            k_pos, chunk_size, rounding_mode="floor"
        )

    return Mask(same_chunk, ("chunked", chunk_size))


def bidirectional_window(radius: int) -> Mask:
    """The keys at most `radius` positions away on either side (2 radius + 1 keys).

    A key is visible when `|q_pos - k_pos| <= radius`.

    Hugging Face's bidirectional sliding window (`sliding_window` = radius);
    ModernBERT's local_attention = 128 is radius 64. For an encoder (causal=False);
    under a causal mask it is the causal window of radius + 1 keys.

    Args:
        radius: R, the farthest visible distance on either side; 0 sees only itself.

    Returns:
        A `Mask`; use it with `Masked` (or posenc.Layer).

    Raises:
        TypeError: `radius` is not an integer.
        ValueError: `radius` < 0.

    Example:
        >>> from posenc.score.masks import bidirectional_window, mask_matrix
        >>> mask_matrix(bidirectional_window(1), range(5), range(5)).int().tolist()
        [[1, 1, 0, 0, 0],
         [1, 1, 1, 0, 0],
         [0, 1, 1, 1, 0],
         [0, 0, 1, 1, 1],
         [0, 0, 0, 1, 1]]
    """
    non_negative_int("radius", radius)

    def near(b, h, q_pos, k_pos):
        return (q_pos - k_pos).abs() <= radius

    return Mask(near, ("bidirectional_window", radius))


def prefix_lm(prefix_len: int) -> Mask:
    """Positions 0..prefix_len-1 see each other both ways; every later query sees them.

    After the prefix, attention is causal.

    The prefix LM of T5 (Raffel et al., 2020) and PaliGemma (image and prompt
    bidirectional, the answer causal). Run with causal=False: the mask is causal itself.
    """
    positive_int("prefix_len", prefix_len)

    def prefix_or_causal(b, h, q_pos, k_pos):
        return (k_pos <= q_pos) | ((k_pos >= 0) & (k_pos < prefix_len) & (q_pos >= 0))

    return Mask(prefix_or_causal, ("prefix_lm", prefix_len), sees_later_keys=True)


def causal_with_blocks(block_ids) -> Mask:
    """Causal, and the tokens of one block see each other both ways (Gemma 3's images).

    `block_ids` gives each position its block: (n,) shared by the batch, or (batch, n),
    indexed by position (0..n-1); -1, or a position outside 0..n-1, is in no block.
    Hugging Face's `or_masks(causal, blockwise_overlay(block_sequence_ids))`, whose ids
    are per index: in the default layout a position is its index. Run with causal=False.
    """
    ids = as_positions("block_ids", block_ids, integer=True)
    if ids.ndim not in (1, 2) or ids.shape[-1] == 0:
        raise ValueError(
            "block_ids must have shape (n,) or (batch, n) with n >= 1, "
            f"got {tuple(ids.shape)}"
        )
    if bool((ids < -1).any()):
        bad = sorted(set(ids[ids < -1].tolist()))
        raise ValueError(
            f"block_ids must be -1 (no block) or a block number >= 0, got {bad}"
        )
    last = ids.shape[-1] - 1

    def block_of(b, pos):
        inside = (pos >= 0) & (pos <= last)
        at = ids.to(pos.device)
        at = at[pos.clamp(0, last)] if at.ndim == 1 else at[b, pos.clamp(0, last)]
        return torch.where(inside, at, -1)

    def causal_or_same_block(b, h, q_pos, k_pos):
        q_block = block_of(b, q_pos)
        return (k_pos <= q_pos) | ((q_block == block_of(b, k_pos)) & (q_block >= 0))

    key = ("causal_with_blocks", tuple(ids.shape), tuple(ids.flatten().tolist()))
    return Mask(
        causal_or_same_block,
        key,
        sees_later_keys=True,
        rows=ids.shape[0] if ids.ndim == 2 else None,
    )


def and_masks(*mods: MaskMod) -> MaskMod:
    """A mask_mod that allows a pair when every one of `mods` does."""
    if not mods:
        raise ValueError("and_masks needs at least one mask_mod")

    def all_of(b, h, q_pos, k_pos):
        allowed = mods[0](b, h, q_pos, k_pos)
        for mod in mods[1:]:
            allowed = allowed & mod(b, h, q_pos, k_pos)
        return allowed

    return all_of


def or_masks(*mods: MaskMod) -> MaskMod:
    """A mask_mod that allows a pair when any one of `mods` does."""
    if not mods:
        raise ValueError("or_masks needs at least one mask_mod")

    def any_of(b, h, q_pos, k_pos):
        allowed = mods[0](b, h, q_pos, k_pos)
        for mod in mods[1:]:
            allowed = allowed | mod(b, h, q_pos, k_pos)
        return allowed

    return any_of


def mask_matrix(mask_mod: MaskMod, q_positions, k_positions) -> torch.Tensor:
    """The (len(q), len(k)) boolean matrix of a mask_mod: True where q may see k."""
    q = as_positions("q_positions", q_positions, integer=True)
    k = as_positions("k_positions", k_positions, integer=True).to(q.device)
    if q.ndim != 1 or k.ndim != 1:
        raise ValueError(
            "q_positions and k_positions must be one-dimensional, "
            f"got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    zero = torch.zeros((), dtype=torch.long, device=q.device)
    return torch.as_tensor(mask_mod(zero, zero, q[:, None], k[None, :])).expand(
        len(q), len(k)
    )


class Masked(Layer):
    """An inner scheme (NoPE by default) with a mask over positions.

    `Masked(chunked(8192), Rope(128))` is Llama 4's local layer.

    The mask is a `Mask` of this module; the inner scheme keeps its own hook. A
    mask that lets queries see later keys (prefix_lm, causal_with_blocks) runs with
    causal=False, and posenc.attention refuses causal=True for it. It is the
    posenc.layer.Layer with a mask and nothing else.

    Args:
        mask: a `Mask` (`sliding_window`, `chunked`, `bidirectional_window`,
            `prefix_lm`, `causal_with_blocks`).
        inner: the scheme whose hook the layer keeps; None for NoPE.

    Raises:
        TypeError: `mask` is not a Mask (a bare mask_mod function, say), or `inner`
            is not a Scheme.
        ValueError: `inner` is itself masked (combine the masks into one).

    Example:
        >>> import torch, posenc
        >>> from posenc.score.masks import Masked, chunked
        >>> local = Masked(chunked(3), posenc.Rope(head_dim=8))
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g)
        >>> _, weights = posenc.attention(q, k, v, local, return_weights=True)
        >>> weights[0, 0].gt(0).int().tolist()  # causal inside chunks of 3
        [[1, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0],
         [0, 0, 0, 1, 0, 0],
         [0, 0, 0, 1, 1, 0],
         [0, 0, 0, 1, 1, 1]]
    """

    name = "masked"

    def __init__(self, mask: Mask, inner: Scheme | None = None):
        if not isinstance(mask, Mask):
            raise TypeError(
                "mask must be a posenc.score.masks.Mask (sliding_window, chunked, "
                "bidirectional_window, prefix_lm, causal_with_blocks), "
                f"got {type(mask).__name__}"
            )
        if isinstance(inner, Layer):
            raise ValueError(
                f"inner must not be another masked scheme ({inner.name}): "
                "combine the masks into one"
            )
        super().__init__(inner, mask)

    def extra_repr(self) -> str:
        return f"mask={self.mask.key[0]}"


@register
class SlidingWindow(Masked):
    """Each query sees only the last `window` keys, itself included (i - W < j <= i).

    The window is a mask on the scores; the inner scheme (NoPE, RoPE, ALiBi, ...)
    keeps its own hook, so `SlidingWindow(4096, Rope(128))` is Mistral-style attention.
    `num_sinks` keeps the first positions visible to every query (StreamingLLM).
    A `KVCache` for it rolls, keeping only the last `window` keys (and the sinks).
    Registered as ``"sliding_window"``.

    Args:
        window (int): W, the keys each query sees, itself included.
        inner: the scheme whose hook the layer keeps; None for NoPE.
        num_sinks: the first positions every later query sees as well, at most W.

    Raises:
        TypeError: `window` or `num_sinks` is not an integer, or `inner` is not a
            Scheme.
        ValueError: `window` < 1, `num_sinks` < 0 or > `window`, or `inner` is
            itself masked.

    Example:
        >>> import torch, posenc
        >>> mistral = posenc.SlidingWindow(3, posenc.Rope(head_dim=8))
        >>> mistral.hook, mistral.window, mistral.num_sinks
        ('score', 3, 0)
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g)
        >>> out, weights = posenc.attention(q, k, v, mistral, return_weights=True)
        >>> weights[0, 0, 5].gt(0).tolist()  # the last query sees keys 3, 4, 5
        [False, False, False, True, True, True]
        >>> sdpa = posenc.attention(q, k, v, mistral, backend="sdpa")
        >>> torch.testing.assert_close(sdpa, out)
    """

    name = "sliding_window"

    def __init__(self, window: int, inner: Scheme | None = None, num_sinks: int = 0):
        # sliding_window checks window and num_sinks
        super().__init__(sliding_window(window, num_sinks), inner)

    def extra_repr(self) -> str:
        return f"window={self.window}" + (
            f", num_sinks={self.num_sinks}" if self.num_sinks else ""
        )
