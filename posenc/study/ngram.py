"""Byte n-gram baselines: what the last n-1 bytes alone predict, counted on the training
split.

An add-k n-gram model gives p(x | c) = (count(c, x) + k) / (count(c) + 256 k) for the
context c of the n-1 previous bytes. Counting is one sort: every n-gram of the training
bytes is packed into one int64 (8 bits a byte), `torch.unique` counts them, and the
counts of the validation n-grams are found with `torch.searchsorted`. A 4-gram over 30
MB takes seconds.
"""

from __future__ import annotations

import math

import torch

from .._checks import positive_int

VOCAB = 256


def _codes(data: torch.Tensor, n: int) -> torch.Tensor:
    """The n-grams of a byte tensor, each packed into one int64 (first byte most
    significant).
    """
    data = data.to(torch.int64)
    code = torch.zeros(len(data) - n + 1, dtype=torch.int64)
    for i in range(n):
        code = code * VOCAB + data[i : len(data) - n + 1 + i]
    return code


def _lookup(
    table: tuple[torch.Tensor, torch.Tensor], codes: torch.Tensor
) -> torch.Tensor:
    keys, counts = table
    at = torch.searchsorted(keys, codes).clamp(max=len(keys) - 1)
    return torch.where(keys[at] == codes, counts[at], torch.zeros_like(at))


def _table(data: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys, counts = torch.unique(_codes(data, n), sorted=True, return_counts=True)
    return keys, counts


def ngram_counts(
    train: torch.Tensor, valid: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(count(c, x), count(c)) in `train` for every validation n-gram (c, x), from
    validation position n-1 on.
    """
    positive_int("n", n)
    if len(train) < n or len(valid) < n:
        raise ValueError(f"train and valid need at least n = {n} bytes")
    joint = _lookup(_table(train, n), _codes(valid, n)).double()
    if n == 1:
        return joint, torch.full_like(joint, float(len(train)))
    # a context counts where a next byte follows it in train: count(c) = sum over x of
    # count(c, x)
    return joint, _lookup(_table(train[:-1], n - 1), _codes(valid[:-1], n - 1)).double()


def ngram_losses(
    train: torch.Tensor, valid: torch.Tensor, n: int, k: float = 0.01, counts=None
) -> torch.Tensor:
    """Loss (nats) of every validation byte from position n-1 on, under an add-k byte
    n-gram counted on `train`.

    Entry t is -ln p(valid[t + n - 1] | valid[t : t + n - 1]); for n = 1 it is the
    unigram. `counts` (from ngram_counts) skips the counting when several k are tried.
    """
    if not k > 0:
        raise ValueError(f"k must be positive (add-k smoothing), got {k!r}")
    joint, context = ngram_counts(train, valid, n) if counts is None else counts
    return -torch.log((joint + k) / (context + VOCAB * k))


def byte_losses(
    train: torch.Tensor, valid: torch.Tensor, n: int, k: float = 0.01
) -> torch.Tensor:
    """Loss (nats) of every validation byte under an add-k byte n-gram, aligned with
    `valid`: entry t scores valid[t].

    The first n-1 bytes take their missing context from newlines (the split is whole
    files, each ending in one), so every byte has a loss: a model's target bytes index
    it directly.
    """
    context = torch.full((positive_int("n", n) - 1,), ord("\n"), dtype=valid.dtype)
    return ngram_losses(train, torch.cat((context, valid)), n, k)


def ngram_loss(
    train: torch.Tensor, valid: torch.Tensor, n: int, k: float = 0.01
) -> float:
    """Mean loss in nats per byte of an add-k byte n-gram (see ngram_losses)."""
    return float(ngram_losses(train, valid, n, k).mean())


def ngram_baselines(
    train: torch.Tensor,
    valid: torch.Tensor,
    orders=(2, 3, 4),
    ks=(1.0, 0.1, 0.01, 0.001),
) -> dict:
    """{"bigram", "trigram", "4gram"} -> nats per byte on the whole validation split,
    with the best k of `ks` for each.

    k is chosen on the validation split itself, which favours the baseline: a model that
    beats it beats every add-k n-gram of that order.
    """
    names = {1: "unigram", 2: "bigram", 3: "trigram"}
    out = {}
    for n in orders:
        counts = ngram_counts(train, valid, n)
        losses = {k: float(ngram_losses(train, valid, n, k, counts).mean()) for k in ks}
        best = min(losses, key=losses.get)
        out[names.get(n, f"{n}gram")] = {"loss": round(losses[best], 4), "k": best}
    assert all(math.isfinite(v["loss"]) for v in out.values())
    return out
