"""Byte n-gram baselines: what the last n-1 bytes alone predict, counted on the training
split.

An add-k n-gram model gives p(x | c) = (count(c, x) + k) / (count(c) + 256 k) for the
context c of the n-1 previous bytes. Counting is one sort: every n-gram of the training
bytes is packed into one int64 (8 bits a byte), `torch.unique` counts them, and the
counts of the validation n-grams are found with `torch.searchsorted`. A 4-gram over 30
MB takes seconds.

An add-k model has no backoff: a context never seen gives the uniform guess. The
interpolated Witten-Bell model (`witten_bell_losses`) mixes every order with the one
below it, p_n(x | c) = (count(c, x) + T(c) p_{n-1}(x | c')) / (count(c) + T(c)), where
T(c) is the number of distinct bytes seen after c and c' is c without its first byte;
the unigram is mixed with the uniform guess the same way. It is the baseline that
bites: a byte 6-gram of this kind counts every context of five bytes in the training
split. `target_baselines` scores all of them on the very bytes a study's models are
scored on.
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


def witten_bell_losses(
    train: torch.Tensor, valid: torch.Tensor, order: int = 6
) -> dict[int, torch.Tensor]:
    """Order -> loss (nats) of every validation byte under the interpolated Witten-Bell
    byte n-gram of that order, for orders 1 to `order` (at most 7: 56 bits a code).

    Aligned like byte_losses: entry t scores valid[t], the missing context before the
    split's first bytes taken from newlines. Contexts count where a next byte follows
    them in `train`, as in ngram_counts.
    """
    if not 1 <= positive_int("order", order) <= 7:
        raise ValueError(
            f"order must be in [1, 7] (codes of 8 bits a byte), got {order}"
        )
    padded = torch.cat(
        (torch.full((order - 1,), ord("\n"), dtype=valid.dtype), valid)
    ).to(torch.int64)
    counts = torch.bincount(train.to(torch.int64), minlength=VOCAB).double()
    seen = float((counts > 0).sum())
    unigram = (counts + seen / VOCAB) / (len(train) + seen)
    prob = unigram[valid.to(torch.int64)]
    out = {1: -torch.log(prob)}
    for n in range(2, order + 1):
        keys, joint_counts = _table(train, n)
        context_keys, inverse, types = torch.unique(
            keys // VOCAB, sorted=True, return_inverse=True, return_counts=True
        )
        context_counts = torch.zeros(len(context_keys), dtype=torch.int64)
        context_counts.scatter_add_(0, inverse, joint_counts)
        codes = _codes(padded[order - n :], n)  # entry t ends with valid[t]
        joint = _lookup((keys, joint_counts), codes).double()
        context = _lookup((context_keys, context_counts), codes // VOCAB).double()
        distinct = _lookup((context_keys, types), codes // VOCAB).double()
        mixed = (joint + distinct * prob) / (context + distinct).clamp(min=1)
        prob = torch.where(context > 0, mixed, prob)
        out[n] = -torch.log(prob)
    return out


def target_baselines(
    train: torch.Tensor, valid: torch.Tensor, targets: dict, order: int = 6
) -> dict:
    """The n-gram baselines of a study, as its metadata stores them.

    `targets` maps a protocol to the (sequences, bytes) indices of its target bytes in
    `valid`. Returns "ngram_baselines" and "ngram_add_k" (the add-k bigram to 4-gram on
    the whole validation split, k chosen there), "ngram_interpolated" (Witten-Bell
    orders 1 to `order` on the whole split), and per protocol "ngram_targets" (each
    sequence's mean loss on its targets, as text) and "ngram_on_targets" (their mean)
    for the add-k models ("bigram", "trigram", "4gram") and the Witten-Bell ones from
    order 3 ("wb3" ... "wb6").
    """
    baselines = ngram_baselines(train, valid)
    add_k = {k: v["k"] for k, v in baselines.items()}
    per_byte = {
        name: byte_losses(train, valid, n, add_k[name])
        for n, name in ((2, "bigram"), (3, "trigram"), (4, "4gram"))
    }
    interpolated = witten_bell_losses(train, valid, order)
    per_byte.update({f"wb{n}": interpolated[n] for n in range(3, order + 1)})
    return {
        "ngram_baselines": {k: v["loss"] for k, v in baselines.items()},
        "ngram_add_k": add_k,
        "ngram_interpolated": {
            f"wb{n}": round(float(v.mean()), 4) for n, v in interpolated.items()
        },
        "ngram_targets": {
            proto: {
                k: " ".join(f"{v:.4f}" for v in losses[at].mean(1).tolist())
                for k, losses in per_byte.items()
            }
            for proto, at in targets.items()
        },
        "ngram_on_targets": {
            proto: {
                k: round(float(losses[at].mean()), 4) for k, losses in per_byte.items()
            }
            for proto, at in targets.items()
        },
    }
