"""Positional schemes as small modules, one per scheme, with a registry by name.

Every scheme acts at (at most) one of three places:

* ``"input"``: `embed(positions)` gives a vector added to the token embeddings;
* ``"qk"``: `transform_qk(x, positions)` changes queries and keys before the dot product;
* ``"score"``: `score_bias(q_positions, k_positions, q)` is added to the attention logits,
  and `score_mod(q_positions, k_positions, q)` is the same bias as a FlexAttention score_mod;
  a score scheme may also add `value_term(weights, q_positions, k_positions)` to the output
  (Shaw et al.'s relative values), which only the explicit backend can compute, or restrict
  attention with `score_mask(q_positions, k_positions)` (a sliding window).

The defaults do nothing, so a scheme overrides only the hook where it acts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ._checks import as_positions, choice, positive_float, positive_int
from .alibi import alibi_bias, alibi_slopes, relative_distance
from .masks import window_mask
from .rope import LAYOUTS, apply_rope, rope_frequencies
from .sinusoidal import sinusoidal_encoding
from .relative import METHODS, clipped_relative_index, shaw_key_scores, shaw_value_term, t5_relative_bucket

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

    def score_bias(self, q_positions, k_positions, q: torch.Tensor | None = None) -> torch.Tensor | None:
        """Score hook: a bias added to the scaled logits, or None.

        Shape (num_heads or 1, len(q), len(k)), or (batch, heads, len(q), len(k))
        for a bias that depends on the queries q (batch, heads, q_len, head_dim).
        """
        return None

    def score_mod(self, q_positions, k_positions, q: torch.Tensor | None = None) -> ScoreMod | None:
        """The same bias as a FlexAttention score_mod(score, b, h, q_idx, kv_idx), or None.

        q_idx and kv_idx index the query and key tensors; the positions map them
        to token positions (they differ when decoding against a cache).
        """
        return None

    needs_weights = False  # True where value_term is used: only the explicit backend exposes the weights

    def score_mask(self, q_positions, k_positions) -> torch.Tensor | None:
        """Score hook: a boolean (len(q), len(k)) mask, True where a query may attend (combined with causal), or None."""
        return None

    def value_term(self, weights: torch.Tensor, q_positions, k_positions) -> torch.Tensor | None:
        """Added to the attention output, from the weights (batch, heads, q_len, k_len); or None."""
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

    @property
    def follows_length(self) -> bool:
        """Dynamic NTK without a fixed seq_len: the frequencies follow the largest position seen in each call."""
        return self.rope_type == "dynamic" and "seq_len" not in self.rope_params

    def frequencies_for(self, positions) -> torch.Tensor:
        """The inverse frequencies used for these positions (they depend on them only for dynamic NTK)."""
        if not self.follows_length:
            return self.inv_freq
        seq_len = int(as_positions("positions", positions, integer=False).max()) + 1
        inv_freq, _ = rope_frequencies(self.head_dim, self.base, "dynamic", seq_len=seq_len, **self.rope_params)
        return inv_freq.to(self.inv_freq.device)

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        return apply_rope(x, positions, self.frequencies_for(positions), self.layout, self.attention_factor)

    def extra_repr(self) -> str:
        params = "".join(f", {k}={v}" for k, v in self.rope_params.items())
        return f"head_dim={self.head_dim}, base={self.base:g}, layout={self.layout!r}, rope_type={self.rope_type!r}{params}"


class ALiBi(Scheme):
    """Linear distance penalty -m_h |i - j| on the logits, one fixed slope per head (Press et al., 2022)."""

    name = "alibi"
    hook = "score"

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = positive_int("num_heads", num_heads)
        self.register_float32_buffer("slopes", alibi_slopes(num_heads))

    def score_bias(self, q_positions, k_positions, q=None) -> torch.Tensor:
        return alibi_bias(self.slopes, q_positions, k_positions)

    def score_mod(self, q_positions, k_positions, q=None) -> ScoreMod:
        q_pos = as_positions("q_positions", q_positions, integer=True)
        k_pos = as_positions("k_positions", k_positions, integer=True)
        slopes = self.slopes

        def alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_pos[q_idx] - k_pos[kv_idx]).abs()

        return alibi

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


class LearnedAbsolute(Scheme):
    """A trainable (max_len, dim) table added to the token embeddings, as in BERT and GPT-2.

    It has a row for each position seen in training and nothing beyond: a
    position >= max_len is an error, not a silent index wrap.
    """

    name = "learned"
    hook = "input"

    def __init__(self, max_len: int, dim: int, init_std: float = 0.02):
        super().__init__()
        self.max_len, self.dim = positive_int("max_len", max_len), positive_int("dim", dim)
        self.table = nn.Parameter(torch.randn(max_len, dim) * positive_float("init_std", init_std))

    def embed(self, positions) -> torch.Tensor:
        p = as_positions("positions", positions, integer=True).to(self.table.device)
        if p.numel() and (int(p.min()) < 0 or int(p.max()) >= self.max_len):
            bad = int(p.max()) if int(p.max()) >= self.max_len else int(p.min())
            raise ValueError(f"position {bad} is outside the learned table: positions must be in [0, max_len={self.max_len}); a learned table has no row past max_len")
        return self.table[p]

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}"


class RecurrentAbsolute(Scheme):
    """Positions generated by a learned recurrence, p_0 = s, p_{t+1} = p_t + tanh(W p_t + b).

    One Euler step per position of a learned dynamical system, in the spirit of
    FLOATER (Liu et al., 2020). It is defined at every position, so it can run
    past the training length, but computing position t takes t sequential steps.
    """

    name = "recurrent"
    hook = "input"

    def __init__(self, dim: int, init_std: float = 0.02):
        super().__init__()
        self.dim = positive_int("dim", dim)
        self.start = nn.Parameter(torch.randn(dim) * positive_float("init_std", init_std))
        self.step = nn.Linear(dim, dim)
        nn.init.normal_(self.step.weight, std=0.5 / math.sqrt(dim))  # small weights; the codes' norm still grows with t
        nn.init.zeros_(self.step.bias)

    def embed(self, positions) -> torch.Tensor:
        p = as_positions("positions", positions, integer=True).to(self.start.device)
        if p.numel() and int(p.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(p.min())}")
        codes = [self.start]
        for _ in range(int(p.max()) if p.numel() else 0):
            codes.append(codes[-1] + torch.tanh(self.step(codes[-1])))
        return torch.stack(codes)[p]

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class ShawRelative(Scheme):
    """Learned relative keys and values per clipped distance clip(j - i, -k, k) (Shaw et al., 2018).

    logit_ij += q_i . a^K_ij / sqrt(head_dim) and output_i += sum_j weights_ij a^V_ij,
    with one table of 2k + 1 rows for keys and one for values, shared by the heads.
    `values=False` keeps only the key term, which every backend can run; the value
    term needs the weights, so only the explicit backend runs it. `method` picks
    the naive (q_len, k_len, head_dim) construction or the memory-efficient gather.
    """

    name = "shaw"
    hook = "score"

    def __init__(self, head_dim: int, max_distance: int = 16, values: bool = True, method: str = "gather", init_std: float = 0.02):
        super().__init__()
        self.head_dim = positive_int("head_dim", head_dim)
        self.max_distance = positive_int("max_distance", max_distance)
        self.method = choice("method", method, METHODS)
        std = positive_float("init_std", init_std)
        self.key_table = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * std)
        self.value_table = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * std) if values else None
        self.needs_weights = values

    def _index(self, q_positions, k_positions, device) -> torch.Tensor:
        return clipped_relative_index(q_positions, k_positions, self.max_distance).to(device)

    def _queries(self, q) -> torch.Tensor:
        if q is None:
            raise ValueError("ShawRelative's bias depends on the queries: pass q (batch, heads, q_len, head_dim)")
        return q

    def score_bias(self, q_positions, k_positions, q=None) -> torch.Tensor:
        q = self._queries(q)
        index = self._index(q_positions, k_positions, q.device)
        return shaw_key_scores(q.float(), self.key_table.float(), index, self.method) / math.sqrt(self.head_dim)

    def score_mod(self, q_positions, k_positions, q=None) -> ScoreMod:
        q = self._queries(q)
        index = self._index(q_positions, k_positions, q.device)
        per_row = (q @ self.key_table.to(q.dtype).T) / math.sqrt(self.head_dim)  # (batch, heads, q_len, 2k + 1)

        def shaw_keys(score, b, h, q_idx, kv_idx):
            return score + per_row[b, h, q_idx, index[q_idx, kv_idx]]

        return shaw_keys

    def value_term(self, weights, q_positions, k_positions) -> torch.Tensor | None:
        if self.value_table is None:
            return None
        index = self._index(q_positions, k_positions, weights.device)
        return shaw_value_term(weights, self.value_table, index, self.method)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_distance={self.max_distance}, values={self.value_table is not None}, method={self.method!r}"


class T5Bias(Scheme):
    """One learned scalar per (bucket of relative position, head), added to the logits (Raffel et al., 2020).

    T5 computes it once, in the first layer, and every layer reuses it. T5 also
    drops the 1 / sqrt(head_dim) scaling (pass scale=1.0 to posenc.attention to
    match a T5 checkpoint).
    """

    name = "t5"
    hook = "score"

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True, init_std: float = 0.02):
        super().__init__()
        self.num_heads = positive_int("num_heads", num_heads)
        t5_relative_bucket(torch.zeros(1, dtype=torch.long), bidirectional, num_buckets, max_distance)  # checks the arguments
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.table = nn.Parameter(torch.randn(num_buckets, num_heads) * positive_float("init_std", init_std))

    def buckets(self, q_positions, k_positions) -> torch.Tensor:
        return t5_relative_bucket(relative_distance(q_positions, k_positions), self.bidirectional, self.num_buckets, self.max_distance)

    def score_bias(self, q_positions, k_positions, q=None) -> torch.Tensor:
        return self.table[self.buckets(q_positions, k_positions).to(self.table.device)].permute(2, 0, 1)

    def score_mod(self, q_positions, k_positions, q=None) -> ScoreMod:
        buckets, table = self.buckets(q_positions, k_positions).to(self.table.device), self.table

        def t5_bias(score, b, h, q_idx, kv_idx):
            return score + table[buckets[q_idx, kv_idx], h]

        return t5_bias

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, bidirectional={self.bidirectional}"


class SlidingWindow(Scheme):
    """Each query sees only the last `window` keys, itself included (i - W < j <= i), around an inner scheme.

    The window is a mask on the scores; the inner scheme (NoPE, RoPE, ALiBi, ...)
    keeps its own hook, so `SlidingWindow(64, Rope(64))` is Mistral-style attention.
    """

    name = "sliding_window"
    hook = "score"

    def __init__(self, window: int, inner: Scheme | None = None):
        super().__init__()
        self.window = positive_int("window", window)
        if inner is not None and not isinstance(inner, Scheme):
            raise TypeError(f"inner must be a posenc Scheme or None, got {type(inner).__name__}")
        if isinstance(inner, SlidingWindow):
            raise ValueError("inner must not be another SlidingWindow: give one window")
        self.inner = NoPE() if inner is None else inner
        self.needs_weights = self.inner.needs_weights

    def embed(self, positions):
        return self.inner.embed(positions)

    def transform_qk(self, x, positions):
        return self.inner.transform_qk(x, positions)

    def score_bias(self, q_positions, k_positions, q=None):
        return self.inner.score_bias(q_positions, k_positions, q)

    def score_mod(self, q_positions, k_positions, q=None):
        return self.inner.score_mod(q_positions, k_positions, q)

    def value_term(self, weights, q_positions, k_positions):
        return self.inner.value_term(weights, q_positions, k_positions)

    def score_mask(self, q_positions, k_positions) -> torch.Tensor:
        return window_mask(q_positions, k_positions, self.window)

    def extra_repr(self) -> str:
        return f"window={self.window}"


SCHEMES: dict[str, type[Scheme]] = {
    cls.name: cls for cls in (NoPE, Sinusoidal, LearnedAbsolute, RecurrentAbsolute, Rope, ALiBi, ShawRelative, T5Bias, SlidingWindow)
}


def make_scheme(name: str, **kwargs) -> Scheme:
    """Build a scheme by its registry name, e.g. make_scheme("rope", head_dim=64)."""
    choice("name", name, tuple(SCHEMES))
    return SCHEMES[name](**kwargs)
