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

A scheme is an `nn.Module`, and one rule says where its tensors live: its parameters
and buffers (ALiBi's slopes, RoPE's frequencies, T5's table) sit on the device of the
queries they act on. `scheme.to(device)`, or `model.to(device)` for a model that holds
it, moves them; posenc.attention and KVCache check it (`check_device`) and name the
scheme, both devices and the fix, instead of failing inside torch or copying tables to
the device on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import nn

from ._checks import choice

#: The values of `Scheme.hook`, the three places where position can enter attention
#: and ``"none"``; `register` refuses a scheme whose hook is not one of them.
HOOKS = ("none", "input", "qk", "score")

ScoreMod = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
MaskMod = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


class Scheme(nn.Module):
    """No positions at all (NoPE): the base every scheme overrides at one hook.

    A scheme is an `nn.Module` that changes attention at one of the places `HOOKS`
    names, and overrides only that hook: `embed` (``"input"``), `transform_qk` and
    `transform_k` (``"qk"``), or `score_mod`, `mask_mod`, `query_score_mod` and
    `value_term` (``"score"``); the defaults here change nothing. Class attributes
    state what other modules need to know about a scheme, instead of special cases by
    name: `name` (its registry name), `hook`, `window` and `num_sinks` (a rolling KV
    cache reads them), `per_layer` (one instance per layer of a model),
    `position_axes`, `needs_weights` (only the explicit backend can run it),
    `bias_is_constant`, `sees_later_keys`, `mask_rows` and `softcap`.

    Its parameters and buffers must sit on the device of the queries it acts on
    (`check_device`). Build a registered scheme by name with `make_scheme`.

    Example:
        >>> import torch, posenc
        >>> scheme = posenc.Scheme()
        >>> scheme.hook, scheme.window, scheme.position_axes
        ('none', None, 1)
        >>> x = torch.ones(1, 2, 3, 4)
        >>> scheme.transform_qk(x, torch.arange(3)) is x, scheme.embed(torch.arange(3))
        (True, None)
    """

    name = "nope"
    hook = "none"
    # a method (score, b, h, q_pos, k_pos) -> score in schemes with a bias
    score_mod: ScoreMod | None = None
    # a method (b, h, q_pos, k_pos) -> bool in schemes with a mask
    mask_mod: MaskMod | None = None
    # True where value_term is used: only the explicit backend exposes the weights
    needs_weights = False
    # False where the bias has learned parameters: its dense table cannot be cached
    bias_is_constant = True
    # True where each layer of a model needs its own instance (learned per-layer tables)
    per_layer = False
    # keys a query sees, itself included, where the scheme masks a window
    window: int | None = None
    # first positions every query also sees (attention sinks)
    num_sinks = 0
    # True where the mask lets a query see a later key (prefix LM): it runs with
    # causal=False
    sees_later_keys = False
    # batch size of a mask that differs between sequences, else None
    mask_rows: int | None = None
    # axes of position its query/key transform reads: 2 for (row, col), 3 for
    # (time, height, width)
    position_axes = 1
    # logits capped at +-softcap by cap * tanh(logit / cap) (Gemma 2), where set
    softcap: float | None = None
    # learned sink logits, one per head (posenc.layer.Layer(sinks=...)), are the
    # parameter `sinks` where a scheme has them: not a class attribute here, which
    # would hide an nn.Parameter of that name

    def register_float32_buffer(self, name: str, value: torch.Tensor) -> None:
        """A constant (frequencies, slopes) that stays float32 when the module is cast
        to bf16 or fp16.

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
        # tables derived from the buffers follow them
        self.__dict__.pop("_tables", None)
        return self

    def check_device(self, device: torch.device) -> None:
        """Check that every parameter and buffer of the scheme is on `device`.

        posenc.attention and KVCache call it with the queries' device, so that a scheme
        left on the CPU fails with the fix named instead of inside torch.

        Args:
            device: the device of the queries the scheme acts on.

        Raises:
            ValueError: a parameter or buffer is on another device; the message names
                the scheme, the tensor, both devices and the fix
                (``scheme.to(device)``).

        Example:
            >>> import torch, posenc
            >>> alibi = posenc.ALiBi(num_heads=4)
            >>> alibi.check_device(torch.device("cpu"))  # its slopes are on the CPU
            >>> alibi.check_device(torch.device("meta"))
            Traceback (most recent call last):
            ...
            ValueError: scheme 'alibi' has its slopes on cpu, but the queries are on ...
        """
        for name, t in (*self.named_parameters(), *self.named_buffers()):
            if t.device != device:
                raise ValueError(
                    f"scheme {self.name!r} has its {name} on {t.device}, but the "
                    f"queries are on {device}: move the scheme to the queries' device "
                    "with scheme.to(q.device) (or model.to(device))"
                )

    def embed(self, positions) -> torch.Tensor | None:
        """Input hook: the codes added to the token embeddings, or None.

        Args:
            positions: (seq_len,) or (batch, seq_len) positions.

        Returns:
            A tensor of shape ``positions.shape + (dim,)`` for an input-hook scheme
            (Sinusoidal, LearnedAbsolute, RecurrentAbsolute); None for the others,
            whose position enters inside attention.

        Example:
            >>> import torch, posenc
            >>> posenc.Sinusoidal(dim=16).embed(torch.arange(10)).shape
            torch.Size([10, 16])
            >>> posenc.NoPE().embed(torch.arange(10)) is None
            True
        """
        return None

    def transform_qk(self, x: torch.Tensor, positions) -> torch.Tensor:
        """Query/key hook: queries (or keys) changed by their positions before the dot
        product; `x` itself for schemes at another hook.

        Args:
            x: queries or keys, (batch, heads, seq_len, head_dim).
            positions: (seq_len,) or (batch, seq_len) positions, or a ``range``; for a
                scheme with `position_axes` > 1, coordinates (axes, seq_len) or
                (axes, batch, seq_len).

        Returns:
            A tensor of the shape and dtype of `x`.

        Example:
            >>> import torch, posenc
            >>> rope = posenc.Rope(head_dim=8)
            >>> q = torch.ones(1, 2, 5, 8)
            >>> rope.transform_qk(q, torch.arange(5)).shape
            torch.Size([1, 2, 5, 8])
            >>> torch.testing.assert_close(rope.transform_qk(q, torch.zeros(5)), q)
        """
        return x

    def transform_k(self, x: torch.Tensor, positions) -> torch.Tensor:
        """The query/key hook for keys: `transform_qk`, unless a scheme treats keys
        differently from queries (xPos scales them by the inverse factor).

        Args:
            x: keys, (batch, heads, seq_len, head_dim).
            positions: as for `transform_qk`.

        Returns:
            A tensor of the shape and dtype of `x`.

        Example:
            >>> import torch, posenc
            >>> k = torch.ones(1, 2, 5, 8)
            >>> rope = posenc.Rope(head_dim=8)
            >>> torch.testing.assert_close(
            ...     rope.transform_k(k, torch.arange(5)),
            ...     rope.transform_qk(k, torch.arange(5)),
            ... )
        """
        return self.transform_qk(x, positions)

    def query_score_mod(self, q: torch.Tensor, positions) -> ScoreMod | None:
        """A bias that reads the queries, as an index-space
        score_mod(score, b, h, q_idx, kv_idx); None for most schemes.

        `positions` (a posenc.positions.Positions) maps indices to positions with
        `q_at(b, q_idx)` and `k_at(b, kv_idx)`.
        """
        return None

    def value_term(self, weights: torch.Tensor, positions) -> torch.Tensor | None:
        """Added to the attention output, from the weights (batch, heads, q_len, k_len)
        and the call's Positions; or None."""
        return None

    def mask_key(self) -> Hashable | None:
        """What identifies this scheme's mask_mod, for caching block masks per shape
        (None: no mask)."""
        return None

    def cached(self, key: Hashable, make: Callable[[], object], size: int = 4):
        """A table derived from constants (a dense bias, a block mask, cos and sin),
        kept for the last `size` keys."""
        tables = self.__dict__.setdefault("_tables", {})
        if key not in tables:
            while len(tables) >= size:
                tables.pop(next(iter(tables)))
            tables[key] = make()
        return tables[key]


class NoPE(Scheme):
    """No positional information: the baseline, permutation-equivariant without a
    causal mask.

    Under a causal mask a NoPE model still tells positions apart (a query sees as many
    keys as its position plus one); without one, permuting the tokens permutes the
    outputs. Registered as ``"nope"``.

    Example:
        >>> import torch, posenc
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g)
        >>> perm = torch.randperm(6, generator=g)
        >>> out = posenc.attention(q, k, v, posenc.NoPE(), causal=False)
        >>> shuffled = posenc.attention(
        ...     q[:, :, perm], k[:, :, perm], v[:, :, perm], posenc.NoPE(), causal=False
        ... )
        >>> torch.testing.assert_close(shuffled, out[:, :, perm])
    """


#: The registry of schemes, ``{name: class}``, from which `make_scheme` builds and to
#: which `register` adds. Names are the schemes' `name` attributes (``"nope"``,
#: ``"rope"``, ``"alibi"``, ``"t5"``, ...).
SCHEMES: dict[str, type[Scheme]] = {"nope": NoPE}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator: make a scheme buildable by name with `make_scheme`.

    The scheme is registered under its `name` attribute, replacing any scheme of that
    name.

    Args:
        cls: a subclass of `Scheme`, with class attributes `name` and `hook`.

    Returns:
        `cls`, unchanged.

    Raises:
        ValueError: `cls.hook` is not one of `HOOKS`.

    Example:
        >>> import posenc
        >>> @posenc.register
        ... class Doubled(posenc.Scheme):
        ...     name, hook = "doubled_example", "qk"
        ...
        ...     def transform_qk(self, x, positions):
        ...         return 2 * x
        >>> type(posenc.make_scheme("doubled_example")).__name__
        'Doubled'
        >>> del posenc.SCHEMES["doubled_example"]
    """
    choice("hook", cls.hook, HOOKS)
    SCHEMES[cls.name] = cls
    return cls


def make_scheme(name: str, **kwargs) -> Scheme:
    """Build a scheme by its registry name.

    Args:
        name: a key of `SCHEMES` (``"rope"``, ``"alibi"``, ...).
        **kwargs: the arguments of the scheme's constructor (``head_dim=64`` for RoPE,
            ``num_heads=8`` for ALiBi, ...).

    Returns:
        A new instance of ``SCHEMES[name]``.

    Raises:
        ValueError: `name` is not registered (the message lists the names that are);
            the constructor's own errors for bad arguments.

    Example:
        >>> import posenc
        >>> posenc.make_scheme("rope", head_dim=64).hook
        'qk'
        >>> posenc.make_scheme("alibi", num_heads=8).slopes.shape
        torch.Size([8])
        >>> posenc.make_scheme("rotary")
        Traceback (most recent call last):
        ...
        ValueError: name must be one of 'nope', ...; got 'rotary'
    """
    choice("name", name, tuple(SCHEMES))
    return SCHEMES[name](**kwargs)
