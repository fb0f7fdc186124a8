"""Positional schemes as small modules, one per scheme, with a registry by name.

Every scheme acts at (at most) one of three places:

* ``"input"``: `embed(positions)` gives a vector added to the token embeddings;
* ``"qk"``: `transform_qk(x, positions)` changes queries and keys before the dot product;
* ``"score"``: `score_bias(q_positions, k_positions)` is added to the attention logits,
  and `score_mod(q_positions, k_positions)` is the same bias as a FlexAttention score_mod.

The defaults do nothing, so a scheme overrides only the hook where it acts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._checks import as_positions, choice, positive_float, positive_int
from .alibi import alibi_bias, alibi_slopes
from .rope import LAYOUTS, apply_rope, rope_frequencies
from .sinusoidal import sinusoidal_encoding

HOOKS = ("none", "input", "qk", "score")

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Scheme(nn.Module):
    """No positions at all (NoPE): the base every scheme overrides at one hook."""

    name = "nope"
    hook = "none"

    def register_float32_buffer(self, name: str, value: torch.Tensor) -> None:
        """A constant (frequencies, slopes) that stays float32 when the module is cast to bf16 or fp16.

        `model.to(torch.bfloat16)` casts every floating buffer; RoPE frequencies
        rounded to bf16 rotate by wrong angles at large positions, so these are
        restored from an exact copy after every cast (the device still follows).
        """
        self.register_buffer(name, value.to(torch.float32), persistent=False)
        self.__dict__.setdefault("_float32_exact", {})[name] = value.detach().to("cpu", torch.float64)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name, exact in self.__dict__.get("_float32_exact", {}).items():
            self._buffers[name] = exact.to(device=self._buffers[name].device, dtype=torch.float32)
        return self

    def embed(self, positions) -> torch.Tensor | None:
        """Input hook: (len(positions), dim) vectors to add to token embeddings, or None."""
        return None

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        """Query/key hook: x is (..., seq_len, head_dim); positions (seq_len,)."""
        return x

    def score_bias(self, q_positions, k_positions) -> torch.Tensor | None:
        """Score hook: (num_heads or 1, len(q), len(k)) bias added to the logits, or None."""
        return None

    def score_mod(self, q_positions, k_positions) -> ScoreMod | None:
        """The same bias as a FlexAttention score_mod(score, b, h, q_idx, kv_idx), or None.

        q_idx and kv_idx index the query and key tensors; the positions map them
        to token positions (they differ when decoding against a cache).
        """
        return None


class NoPE(Scheme):
    """No positional information: the baseline, permutation-equivariant without a causal mask."""


class Sinusoidal(Scheme):
    """Fixed sin/cos table added to the token embeddings (Vaswani et al., 2017)."""

    name = "sinusoidal"
    hook = "input"

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.dim = positive_int("dim", dim)
        self.base = positive_float("base", base, minimum=1.0)

    def embed(self, positions) -> torch.Tensor:
        return sinusoidal_encoding(positions, self.dim, self.base)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}"


class Rope(Scheme):
    """Rotary position embedding applied to queries and keys (Su et al., RoFormer)."""

    name = "rope"
    hook = "qk"

    def __init__(self, head_dim: int, base: float = 10000.0, layout: str = "half", rope_type: str = "default", **rope_params):
        super().__init__()
        self.layout = choice("layout", layout, LAYOUTS)
        self.rope_type = rope_type
        self.rope_params = dict(rope_params)
        inv_freq, attention_factor = rope_frequencies(head_dim, base, rope_type, **rope_params)
        self.head_dim, self.base, self.attention_factor = head_dim, base, attention_factor
        self.register_float32_buffer("inv_freq", inv_freq)

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        return apply_rope(x, positions, self.inv_freq, self.layout, self.attention_factor)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, layout={self.layout!r}, rope_type={self.rope_type!r}"


class ALiBi(Scheme):
    """Linear distance penalty -m_h |i - j| on the logits, one fixed slope per head (Press et al., 2022)."""

    name = "alibi"
    hook = "score"

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = positive_int("num_heads", num_heads)
        self.register_float32_buffer("slopes", alibi_slopes(num_heads))

    def score_bias(self, q_positions, k_positions) -> torch.Tensor:
        return alibi_bias(self.slopes, q_positions, k_positions)

    def score_mod(self, q_positions, k_positions) -> ScoreMod:
        q_pos = as_positions("q_positions", q_positions, integer=True)
        k_pos = as_positions("k_positions", k_positions, integer=True)
        slopes = self.slopes

        def alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_pos[q_idx] - k_pos[kv_idx]).abs()

        return alibi

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


SCHEMES: dict[str, type[Scheme]] = {cls.name: cls for cls in (NoPE, Sinusoidal, Rope, ALiBi)}


def make_scheme(name: str, **kwargs) -> Scheme:
    """Build a scheme by its registry name, e.g. make_scheme("rope", head_dim=64)."""
    choice("name", name, tuple(SCHEMES))
    return SCHEMES[name](**kwargs)
