"""A tiny Transformer that takes any scheme of the package by name (pre-norm, GPT-style).

Small enough to read in one sitting and to train on a CPU in seconds: the
chapters train it on toy tasks, the experiment chapter on real text.
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
    """make_scheme(name) with the model's sizes filled in where the scheme takes them.

    head_dim, dim, num_heads and max_len are passed to the schemes whose
    constructor names them; `overrides` (base, max_distance, ...) win. For
    "sliding_window", `inner` may name the inner scheme, with `inner_args`.
    """
    if name not in SCHEMES:
        return make_scheme(name)  # raises the registry's error
    if isinstance(
        overrides.get("inner"), str
    ):  # a sliding window around a scheme named by the caller
        overrides["inner"] = build_scheme(
            overrides["inner"],
            dim,
            num_heads,
            max_len,
            **overrides.pop("inner_args", {}),
        )
    sizes = {
        "head_dim": dim // num_heads,
        "dim": dim,
        "num_heads": num_heads,
        "max_len": max_len,
    }
    accepted = inspect.signature(SCHEMES[name]).parameters
    return make_scheme(
        name, **{**{k: v for k, v in sizes.items() if k in accepted}, **overrides}
    )


class Block(nn.Module):
    """LayerNorm, multi-head attention with a scheme, LayerNorm, MLP; each with a residual."""

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
        self.num_heads, self.scheme, self.causal, self.backend, self.scale = (
            num_heads,
            scheme,
            causal,
            backend,
            scale,
        )
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
    """Token embedding, the scheme's input code (if any), `num_layers` blocks, LayerNorm, output layer.

    `scheme` is a registry name (nope, sinusoidal, learned, recurrent, rope,
    alibi, shaw, t5, sliding_window); `scheme_args` override its defaults. An
    input-hook scheme is added to the embeddings once; a query/key or score scheme
    acts in every layer (one shared instance, or one per layer where the scheme says
    `per_layer`, as Shaw's learned tables do).
    `scheme` may instead be a list of schemes, one per layer (a model's recipe, as
    posenc.layer_schemes builds it, or windowed RoPE layers with a NoPE layer between):
    each layer runs its own, and num_layers is the list's length.
    `max_len` sizes the learned table; other schemes accept any length.
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
            args.setdefault(
                "bidirectional", not causal
            )  # a decoder's future keys are masked: give their buckets to the past
        if (
            scheme in SCHEMES
            and SCHEMES[scheme].hook == "input"
            and "init_std" in inspect.signature(SCHEMES[scheme]).parameters
        ):
            args.setdefault(
                "init_std", EMBEDDING_STD
            )  # a learned code starts at the scale of the token embeddings
        if scheme == "layers":
            self.input_scheme = NoPE()
        else:
            first = build_scheme(scheme, dim, num_heads, max_len, **args)
            self.input_scheme = first  # its embed() is added to the token embeddings (None for most schemes)
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
        """Check a list of per-layer schemes: attention schemes at the query/key or score hook, sinks sized to the heads."""
        if (
            isinstance(schemes, Scheme)
            or not isinstance(schemes, (list, tuple))
            or not schemes
        ):
            raise TypeError(
                f"scheme must be a registry name or a non-empty list of schemes (one per layer), got {type(schemes).__name__}"
            )
        for i, s in enumerate(schemes):
            if not isinstance(s, Scheme):
                raise TypeError(
                    f"layer {i} is {s!r}, not a posenc scheme: TinyTransformer's layers are all softmax attention"
                )
            if s.hook == "input":
                raise ValueError(
                    f"layer {i} is an input-hook scheme ({s.name}), which acts once on the embeddings: pass it by name instead"
                )
            sinks = getattr(s, "sinks", None)
            if sinks is not None and len(sinks) != num_heads:
                raise ValueError(
                    f"layer {i} has sink logits for {len(sinks)} heads, but the model has num_heads={num_heads}"
                )
        return list(schemes)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # token embeddings of unit scale per entry, as the original Transformer's sqrt(d_model) scaling gives:
        # a sinusoidal code (entries of size 1) then neither drowns the content nor is drowned by it
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
        """Logits (batch, seq_len, vocab_size) for integer tokens (batch, seq_len).

        positions are (seq_len,) or (batch, seq_len) (left padding, packed sequences);
        they default to 0..seq_len-1. With `caches` (KVCache.for_layers of the model's
        schemes) the tokens are the next chunk of a stream: each layer appends its keys and
        values to its cache and attends to everything kept there (give the chunk's positions).
        """
        if tokens.ndim != 2 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"tokens must be an integer tensor of shape (batch, seq_len), got {tuple(tokens.shape)} {tokens.dtype}"
            )
        batch, length = tokens.shape
        positions = (
            torch.arange(length, device=tokens.device)
            if positions is None
            else as_positions("positions", positions, integer=True).to(tokens.device)
        )
        if positions.shape not in ((length,), (batch, length)):
            raise ValueError(
                f"positions must have shape ({length},) or ({batch}, {length}), got {tuple(positions.shape)}"
            )
        x = self.embed(tokens)
        code = self.input_scheme.embed(positions)
        if code is not None:
            x = x + code.to(x.dtype)
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(
                f"caches must hold one KVCache per layer ({len(self.blocks)}), got {len(caches)}"
            )
        for i, block in enumerate(self.blocks):
            x = block(x, positions, mask, None if caches is None else caches[i])
        return self.head(self.norm(x))

    def layer_schemes(self) -> list[Scheme]:
        """The scheme of each layer, for KVCache.for_layers."""
        return [block.scheme for block in self.blocks]


def train(
    model: nn.Module, batches, steps: int, lr: float = 3e-3, weight_decay: float = 0.0
) -> list[float]:
    """AdamW on next-token cross-entropy; `batches(step)` returns (inputs, targets), targets -100 are ignored.

    Returns the loss of every step. Deterministic for a fixed seed and machine.
    """
    positive_int("steps", steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    model.train()
    for step in range(steps):
        inputs, targets = batches(step)
        logits = model(inputs)
        loss = nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=-100
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses
