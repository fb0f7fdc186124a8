"""The scheme interface: where position enters attention, and a registry by name.

Every scheme acts at (at most) one of three places, and overrides only that hook:

* ``"input"``: `embed(positions)` gives vectors added to the token embeddings
  (posenc.input: sinusoidal, learned, recurrent);
* ``"qk"``: `transform_qk(x, positions)` changes queries and keys before the dot
  product (posenc.qk: RoPE and its frequency rescalings); a scheme that treats keys
  differently from queries (xPos scales them by the inverse) also overrides
  `transform_k`. A scheme with several position axes (`position_axes` 2 or 3: axial
  2-D RoPE, M-RoPE) receives them as one (axes, seq_len) or (axes, batch, seq_len)
  tensor, while masks and biases keep the 1-D order of the sequence;
* ``"score"``: `score_mod(score, b, h, q_pos, k_pos)` adds a bias to one logit and
  `mask_mod(b, h, q_pos, k_pos)` says whether a query may see a key (posenc.score:
  ALiBi, T5, Shaw, sliding windows). Each is written once, for one query and one
  key, in FlexAttention's form but over *positions*: posenc.attention maps the
  kernel's indices to positions, compiles it into FlexAttention, and evaluates it on
  index grids for the dense bias and mask the other backends need.

A bias that reads the queries (Shaw et al.'s relative keys) gives `query_score_mod`
instead, and one computed from the attention weights (Shaw's relative values) gives
`value_term`, which only the explicit backend can run (`needs_weights`).

A scheme is an `nn.Module`, and one rule says where its tensors live: its parameters and
buffers (ALiBi's slopes, RoPE's frequencies, T5's table) sit on the device of the queries
they act on. `scheme.to(device)`, or `model.to(device)` for a model that holds it, moves them;
posenc.attention and KVCache check it (`check_device`) and name the scheme, both devices and
the fix, instead of failing inside torch or copying tables to the device on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import nn

from ._checks import choice

HOOKS = ("none", "input", "qk", "score")

ScoreMod = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
MaskMod = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


class Scheme(nn.Module):
    """No positions at all (NoPE): the base every scheme overrides at one hook."""

    name = "nope"
    hook = "none"
    score_mod: ScoreMod | None = (
        None  # a method (score, b, h, q_pos, k_pos) -> score in schemes with a bias
    )
    mask_mod: MaskMod | None = (
        None  # a method (b, h, q_pos, k_pos) -> bool in schemes with a mask
    )
    needs_weights = False  # True where value_term is used: only the explicit backend exposes the weights
    bias_is_constant = True  # False where the bias has learned parameters: its dense table cannot be cached
    per_layer = False  # True where each layer of a model needs its own instance (learned per-layer tables)
    window: int | None = (
        None  # keys a query sees, itself included, where the scheme masks a window
    )
    num_sinks = 0  # first positions every query also sees (attention sinks)
    sees_later_keys = False  # True where the mask lets a query see a later key (prefix LM): it runs with causal=False
    mask_rows: int | None = (
        None  # batch size of a mask that differs between sequences, else None
    )
    position_axes = 1  # axes of position its query/key transform reads: 2 for (row, col), 3 for (time, height, width)
    softcap: float | None = (
        None  # logits capped at +-softcap by cap * tanh(logit / cap) (Gemma 2), where set
    )
    # learned sink logits, one per head (posenc.layer.Layer(sinks=...)), are the parameter `sinks` where a scheme has
    # them: not a class attribute here, which would hide an nn.Parameter of that name

    def register_float32_buffer(self, name: str, value: torch.Tensor) -> None:
        """A constant (frequencies, slopes) that stays float32 when the module is cast to bf16 or fp16.

        `model.to(torch.bfloat16)` casts every floating buffer; RoPE frequencies
        rounded to bf16 rotate by wrong angles at large positions, so these are
        restored from an exact copy after every cast (the device still follows).
        """
        self.register_buffer(name, value.to(torch.float32), persistent=False)
        self.__dict__.setdefault("_float32_exact", {})[name] = value.detach().to(
            "cpu", torch.float64
        )

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name, exact in self.__dict__.get("_float32_exact", {}).items():
            self._buffers[name] = exact.to(
                device=self._buffers[name].device, dtype=torch.float32
            )
        self.__dict__.pop(
            "_tables", None
        )  # tables derived from the buffers follow them
        return self

    def check_device(self, device: torch.device) -> None:
        """Raise a ValueError where a parameter or buffer of the scheme is not on `device` (the queries')."""
        for name, t in (*self.named_parameters(), *self.named_buffers()):
            if t.device != device:
                raise ValueError(
                    f"scheme {self.name!r} has its {name} on {t.device}, but the queries are on {device}: "
                    f"move the scheme to the queries' device with scheme.to(q.device) (or model.to(device))"
                )

    def embed(self, positions) -> torch.Tensor | None:
        """Input hook: vectors of shape positions.shape + (dim,) to add to token embeddings, or None."""
        return None

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        """Query/key hook: x is (batch, heads, seq_len, head_dim); positions (seq_len,) or (batch, seq_len).

        For a scheme with position_axes > 1, positions may also be (axes, seq_len) or (axes, batch, seq_len).
        """
        return x

    def transform_k(self, x: torch.Tensor, positions) -> torch.Tensor:
        """The query/key hook for keys: transform_qk, unless a scheme treats keys differently (xPos)."""
        return self.transform_qk(x, positions)

    def query_score_mod(self, q: torch.Tensor, positions) -> ScoreMod | None:
        """A bias that reads the queries, as an index-space score_mod(score, b, h, q_idx, kv_idx); None for most schemes.

        `positions` (a posenc.positions.Positions) maps indices to positions with
        `q_at(b, q_idx)` and `k_at(b, kv_idx)`.
        """
        return None

    def value_term(self, weights: torch.Tensor, positions) -> torch.Tensor | None:
        """Added to the attention output, from the weights (batch, heads, q_len, k_len) and the call's Positions; or None."""
        return None

    def mask_key(self) -> Hashable | None:
        """What identifies this scheme's mask_mod, for caching block masks per shape (None: no mask)."""
        return None

    def cached(self, key: Hashable, make: Callable[[], object], size: int = 4):
        """A table derived from constants (a dense bias, a block mask, cos and sin), kept for the last `size` keys."""
        tables = self.__dict__.setdefault("_tables", {})
        if key not in tables:
            while len(tables) >= size:
                tables.pop(next(iter(tables)))
            tables[key] = make()
        return tables[key]


class NoPE(Scheme):
    """No positional information: the baseline, permutation-equivariant without a causal mask."""


SCHEMES: dict[str, type[Scheme]] = {"nope": NoPE}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator: make a scheme buildable by name with make_scheme (its `name` attribute)."""
    choice("hook", cls.hook, HOOKS)
    SCHEMES[cls.name] = cls
    return cls


def make_scheme(name: str, **kwargs) -> Scheme:
    """Build a scheme by its registry name, e.g. make_scheme("rope", head_dim=64)."""
    choice("name", name, tuple(SCHEMES))
    return SCHEMES[name](**kwargs)
