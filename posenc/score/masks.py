"""Masks as FlexAttention mask_mods over positions, and the sliding-window scheme.

A mask_mod(b, h, q_pos, k_pos) says whether the query at q_pos may attend to the key
at k_pos (True: it may). Each mask is written once, for one pair; `and_masks` and
`or_masks` combine them, as attention-gym does; `mask_matrix` evaluates one on a grid
of positions (the dense boolean mask the explicit and sdpa backends use), and
posenc.attention turns the same function into FlexAttention's block mask.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from .._checks import as_positions, non_negative_int, positive_int
from ..scheme import MaskMod, NoPE, Scheme, register


def causal(b, h, q_pos, k_pos):
    """A key is visible when it is not after the query: k_pos <= q_pos."""
    return k_pos <= q_pos


def sliding_window(window: int, num_sinks: int = 0) -> MaskMod:
    """The causal window of `window` keys, the query itself included: q_pos - window < k_pos <= q_pos.

    With `num_sinks` > 0 the first positions 0..num_sinks-1 (never a negative one, such as
    left padding's) stay visible to every later query as well (the attention sinks of
    StreamingLLM, Xiao et al., 2024). A window of W keys includes the query (Hugging Face's
    convention): window=1 sees only itself.
    """
    positive_int("window", window)
    if non_negative_int("num_sinks", num_sinks) > window:
        raise ValueError(f"num_sinks must not exceed the window: got num_sinks={num_sinks}, window={window}")

    def window_mod(b, h, q_pos, k_pos):
        return (k_pos <= q_pos) & (q_pos - k_pos < window)

    def sinks_mod(b, h, q_pos, k_pos):
        return (k_pos <= q_pos) & (k_pos >= 0) & (k_pos < num_sinks)

    return or_masks(window_mod, sinks_mod) if num_sinks else window_mod


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
    """The (len(q), len(k)) boolean matrix of a mask_mod: True where the query may attend to the key."""
    q = as_positions("q_positions", q_positions, integer=True)
    k = as_positions("k_positions", k_positions, integer=True).to(q.device)
    if q.ndim != 1 or k.ndim != 1:
        raise ValueError(f"q_positions and k_positions must be one-dimensional, got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    zero = torch.zeros((), dtype=torch.long, device=q.device)
    return torch.as_tensor(mask_mod(zero, zero, q[:, None], k[None, :])).expand(len(q), len(k))


@register
class SlidingWindow(Scheme):
    """Each query sees only the last `window` keys, itself included (i - W < j <= i), around an inner scheme.

    The window is a mask on the scores; the inner scheme (NoPE, RoPE, ALiBi, ...)
    keeps its own hook, so `SlidingWindow(4096, Rope(128))` is Mistral-style attention.
    `num_sinks` keeps the first positions visible to every query (StreamingLLM).
    """

    name = "sliding_window"
    hook = "score"

    def __init__(self, window: int, inner: Scheme | None = None, num_sinks: int = 0):
        super().__init__()
        self._window_mod = sliding_window(window, num_sinks)  # checks window and num_sinks
        self.window, self.num_sinks = window, num_sinks
        if inner is not None and not isinstance(inner, Scheme):
            raise TypeError(f"inner must be a posenc Scheme or None, got {type(inner).__name__}")
        if isinstance(inner, SlidingWindow):
            raise ValueError("inner must not be another SlidingWindow: give one window")
        self.inner = NoPE() if inner is None else inner
        self.needs_weights, self.bias_is_constant, self.per_layer = self.inner.needs_weights, self.inner.bias_is_constant, self.inner.per_layer
        self.position_axes = self.inner.position_axes

    def mask_mod(self, b, h, q_pos, k_pos):
        return self._window_mod(b, h, q_pos, k_pos)

    def mask_key(self) -> Hashable:
        return ("sliding_window", self.window, self.num_sinks)

    @property
    def score_mod(self):
        return self.inner.score_mod

    def embed(self, positions):
        return self.inner.embed(positions)

    def transform_qk(self, x, positions):
        return self.inner.transform_qk(x, positions)

    def transform_k(self, x, positions):
        return self.inner.transform_k(x, positions)

    def query_score_mod(self, q, positions):
        return self.inner.query_score_mod(q, positions)

    def value_term(self, weights, positions):
        return self.inner.value_term(weights, positions)

    def extra_repr(self) -> str:
        return f"window={self.window}" + (f", num_sinks={self.num_sinks}" if self.num_sinks else "")
