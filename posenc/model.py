"""A tiny Transformer that takes any scheme of the package by name (pre-norm,
GPT-style).

Small enough to read in one sitting and to train on a CPU in seconds: the
chapters train it on toy tasks (with posenc.training.train), the experiment chapter on
real text.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ._checks import as_positions, positive_int
from .cache import KVCache
from .core import attention
from .scheme import SCHEMES, NoPE, Scheme, make_scheme

EMBEDDING_STD = 1.0


def build_scheme(
    name: str, dim: int, num_heads: int, max_len: int, **overrides
) -> Scheme:
    """`make_scheme` with the model's sizes filled in where the scheme takes them.

    head_dim (dim // num_heads), dim, num_heads and max_len are passed to the schemes
    whose constructor names them; `overrides` win. TinyTransformer builds its schemes
    with it.

    Args:
        name: a registry name (a key of posenc.SCHEMES).
        dim: the model's width.
        num_heads: its number of attention heads.
        max_len: the longest sequence it takes (the size of a learned table).
        **overrides: other arguments of the scheme (``base``, ``max_distance``, ...);
            for ``"sliding_window"``, ``inner`` may name the inner scheme, with
            ``inner_args`` its arguments.

    Returns:
        The scheme, a new instance.

    Raises:
        ValueError: `name` is not registered; the scheme's own errors for bad
            arguments.

    Example:
        >>> import posenc
        >>> rope = posenc.build_scheme("rope", dim=64, num_heads=8, max_len=512)
        >>> rope.head_dim, posenc.build_scheme("alibi", 64, 8, 512).num_heads
        (8, 8)
        >>> window = posenc.build_scheme(
        ...     "sliding_window", 64, 8, 512, window=16, inner="alibi"
        ... )
        >>> window.window, window.inner.name, window.inner.num_heads
        (16, 'alibi', 8)
    """
    if name not in SCHEMES:
        return make_scheme(name)  # raises the registry's error
    # a sliding window around a scheme named by the caller
    if isinstance(overrides.get("inner"), str):
        overrides["inner"] = build_scheme(
            overrides["inner"],
            dim,
            num_heads,
            max_len,
            **overrides.pop("inner_args", {}),
        )
    sizes = dict(
        head_dim=dim // num_heads, dim=dim, num_heads=num_heads, max_len=max_len
    )
    accepted = inspect.signature(SCHEMES[name]).parameters
    return make_scheme(
        name, **{**{k: v for k, v in sizes.items() if k in accepted}, **overrides}
    )


class Block(nn.Module):
    """LayerNorm, multi-head attention with a scheme, LayerNorm, MLP; each with a
    residual."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        scheme: Scheme,
        causal: bool,
        backend: str,
        scale: float | None,
    ):
        super().__init__()
        self.num_heads, self.scheme, self.causal = num_heads, scheme, causal
        self.backend, self.scale = backend, scale
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = (
            self.qkv(self.norm1(x))
            .view(batch, length, 3, self.num_heads, dim // self.num_heads)
            .permute(2, 0, 3, 1, 4)
        )
        if cache is None:
            y = attention(
                q,
                k,
                v,
                self.scheme,
                causal=self.causal,
                mask=mask,
                q_positions=positions,
                k_positions=positions,
                backend=self.backend,
                scale=self.scale,
            )
        else:
            y = cache.step(
                q,
                k,
                v,
                positions,
                mask=mask,
                causal=self.causal,
                backend=self.backend,
                scale=self.scale,
            )
        x = x + self.proj(y.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """A decoder-only language model: token embedding, the scheme's input code (if any),
    `num_layers` pre-norm blocks, LayerNorm, output layer.

    An input-hook scheme is added to the embeddings once; a query/key or score scheme
    acts in every layer (one shared instance, or one per layer where the scheme says
    `per_layer`, as Shaw's learned tables do). Token embeddings start with unit-scale
    entries, linear layers with std 0.02.

    Args:
        vocab_size: the number of token ids.
        dim: the model's width, a multiple of `num_heads`.
        num_heads: attention heads per layer (head_dim = dim // num_heads).
        num_layers: the number of blocks (ignored where `scheme` is a list).
        scheme: a registry name (nope, sinusoidal, learned, recurrent, rope, alibi,
            shaw, t5, sliding_window, ...), or a list of schemes, one per layer (a
            model's recipe, as posenc.layer_schemes builds it, or windowed RoPE layers
            with a NoPE layer between): each layer runs its own, and the model has as
            many layers as the list.
        scheme_args: arguments of a named scheme, over the defaults `build_scheme`
            fills in.
        max_len: sizes a learned table; other schemes accept any length.
        causal: a decoder's causal mask (False for an encoder).
        backend: the backend of posenc.attention every layer uses.
        scale: the logits' scale; None for 1/sqrt(head_dim).

    Raises:
        TypeError: a size is not an integer; `scheme` is neither a name nor a
            non-empty list of schemes, or a list entry is not a scheme.
        ValueError: a size is not positive; `dim` is not a multiple of `num_heads`;
            the name is not registered; a list entry is an input-hook scheme, or
            has sink logits for another number of heads.

    Example:
        >>> import torch, posenc
        >>> _ = torch.manual_seed(0)
        >>> model = posenc.TinyTransformer(10, dim=16, num_heads=2, scheme="rope")
        >>> len(model.blocks), [s.name for s in model.layer_schemes()]
        (2, ['rope', 'rope'])
        >>> tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
        >>> model(tokens).shape
        torch.Size([1, 6, 10])
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        scheme: str | list[Scheme] = "nope",
        scheme_args: dict | None = None,
        max_len: int = 512,
        causal: bool = True,
        backend: str = "explicit",
        scale: float | None = None,
    ):
        super().__init__()
        positive_int("vocab_size", vocab_size)
        positive_int("num_layers", num_layers)
        positive_int("num_heads", num_heads)
        if positive_int("dim", dim) % num_heads:
            raise ValueError(
                f"dim ({dim}) must be a multiple of num_heads ({num_heads})"
            )
        if not isinstance(scheme, str):
            layer_schemes = self._layer_list(scheme, num_layers, num_heads)
            scheme, num_layers = "layers", len(layer_schemes)
        self.scheme_name, args = scheme, dict(scheme_args or {})
        if scheme == "t5":
            # a decoder's future keys are masked: give their buckets to the past
            args.setdefault("bidirectional", not causal)
        if (
            scheme in SCHEMES
            and SCHEMES[scheme].hook == "input"
            and "init_std" in inspect.signature(SCHEMES[scheme]).parameters
        ):
            # a learned code starts at the scale of the token embeddings
            args.setdefault("init_std", EMBEDDING_STD)
        if scheme == "layers":
            self.input_scheme = NoPE()
        else:
            first = build_scheme(scheme, dim, num_heads, max_len, **args)
            # its embed() is added to the token embeddings (None for most schemes)
            self.input_scheme = first
            layer_schemes = [first] * num_layers
            if first.hook == "input":
                layer_schemes = [NoPE()] * num_layers
            elif first.per_layer:
                layer_schemes = [first] + [
                    build_scheme(scheme, dim, num_heads, max_len, **args)
                    for _ in range(num_layers - 1)
                ]
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(
            Block(dim, num_heads, s, causal, backend, scale) for s in layer_schemes
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _layer_list(schemes, num_layers: int, num_heads: int) -> list[Scheme]:
        """Check a list of per-layer schemes: attention schemes at the query/key or
        score hook, sinks sized to the heads."""
        if (
            isinstance(schemes, Scheme)
            or not isinstance(schemes, (list, tuple))
            or not schemes
        ):
            raise TypeError(
                "scheme must be a registry name or a non-empty list of schemes "
                f"(one per layer), got {type(schemes).__name__}"
            )
        for i, s in enumerate(schemes):
            if not isinstance(s, Scheme):
                raise TypeError(
                    f"layer {i} is {s!r}, not a posenc scheme: "
                    "TinyTransformer's layers are all softmax attention"
                )
            if s.hook == "input":
                raise ValueError(
                    f"layer {i} is an input-hook scheme ({s.name}), which acts once "
                    "on the embeddings: pass it by name instead"
                )
            sinks = getattr(s, "sinks", None)
            if sinks is not None and len(sinks) != num_heads:
                raise ValueError(
                    f"layer {i} has sink logits for {len(sinks)} heads, "
                    f"but the model has num_heads={num_heads}"
                )
        return list(schemes)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # token embeddings of unit scale per entry, as the original Transformer's
        # sqrt(d_model) scaling gives: a sinusoidal code (entries of size 1) then
        # neither drowns the content nor is drowned by it
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=EMBEDDING_STD)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(
        self,
        tokens: torch.Tensor,
        positions=None,
        mask: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """Logits for a batch of token sequences, or for the next chunk of a stream.

        Args:
            tokens: integer token ids, (batch, seq_len).
            positions: (seq_len,) or (batch, seq_len) integers (left padding, packed
                sequences); 0..seq_len-1 by default.
            mask: a boolean mask, True where a query may attend, broadcastable to
                (batch, heads, seq_len, keys), combined with the causal one.
            caches: KVCache.for_layers of the model's `layer_schemes`: the tokens are
                then the next chunk of a stream, each layer appends its keys and values
                to its cache and attends to everything kept there (give the chunk's
                positions).

        Returns:
            Logits, (batch, seq_len, vocab_size).

        Raises:
            ValueError: `tokens` is not an integer (batch, seq_len) tensor; the
                positions have another shape; `caches` has not one cache per layer;
                and posenc.attention's errors.
            TypeError: `positions` are not integers.

        Example:
            >>> import torch, posenc
            >>> _ = torch.manual_seed(0)
            >>> model = posenc.TinyTransformer(10, dim=16, num_heads=2, scheme="alibi")
            >>> tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
            >>> logits = model(tokens)
            >>> caches = posenc.KVCache.for_layers(model.layer_schemes())
            >>> chunks = [
            ...     model(tokens[:, :4], caches=caches),
            ...     model(tokens[:, 4:], positions=torch.arange(4, 6), caches=caches),
            ... ]
            >>> torch.testing.assert_close(torch.cat(chunks, dim=1), logits)
        """
        if tokens.ndim != 2 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                "tokens must be an integer tensor of shape (batch, seq_len), "
                f"got {tuple(tokens.shape)} {tokens.dtype}"
            )
        batch, length = tokens.shape
        positions = (
            torch.arange(length, device=tokens.device)
            if positions is None
            else as_positions("positions", positions, integer=True).to(tokens.device)
        )
        if positions.shape not in ((length,), (batch, length)):
            raise ValueError(
                f"positions must have shape ({length},) or ({batch}, {length}), "
                f"got {tuple(positions.shape)}"
            )
        x = self.embed(tokens)
        code = self.input_scheme.embed(positions)
        if code is not None:
            x = x + code.to(x.dtype)
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(
                f"caches must hold one KVCache per layer ({len(self.blocks)}), "
                f"got {len(caches)}"
            )
        for i, block in enumerate(self.blocks):
            x = block(x, positions, mask, None if caches is None else caches[i])
        return self.head(self.norm(x))

    def layer_schemes(self) -> list[Scheme]:
        """The scheme of each layer, in order, for KVCache.for_layers.

        Returns:
            A list of schemes, one per block (the same instance where layers share
            one).

        Example:
            >>> import posenc
            >>> model = posenc.TinyTransformer(10, dim=16, num_heads=2, scheme="t5")
            >>> first, second = model.layer_schemes()
            >>> first.name, first is second
            ('t5', True)
        """
        return [block.scheme for block in self.blocks]
