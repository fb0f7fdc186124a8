"""The passkey retrieval task of the position-interpolation and YaRN papers, at byte
level.

A key of digits hides at a chosen depth in repeated filler text ("The grass is green.
The sky is blue. ..."); the sequence ends with a question mark and the model must
produce the key. Scored by exact match of every digit (greedy decoding and
teacher-forced argmax agree on exact match).

Layout of a sequence of `length` bytes: filler | '#' key | filler | '?' key
"""

from __future__ import annotations

import torch

from .._checks import positive_int
from .tasks import IGNORE_INDEX

FILLER = (
    b"The grass is green. The sky is blue. The sun is yellow. Here we go. "
    b"There and back again. "
)
KEY_MARK, QUERY_MARK = ord("#"), ord("?")


def _layout(length: int, digits: int) -> int:
    positive_int("digits", digits)
    filler = positive_int("length", length) - 2 * (digits + 1)
    if filler < 0:
        raise ValueError(
            f"length must be at least {2 * (digits + 1)} to hold the key and the "
            f"question for {digits} digits, got {length}"
        )
    return filler


def passkey_batch(
    length: int, depths, generator: torch.Generator, digits: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, keys) for one sequence per depth in `depths` (fractions in [0,
    1]).

    inputs is (n, length) int64 bytes; targets is -100 except where the model must
    predict a key digit (the positions just before each answer digit); keys is (n,
    digits), the digits' bytes. A depth of 0 puts the key first, 1 right before the
    question.
    """
    filler_len = _layout(length, digits)
    depths = torch.as_tensor(depths, dtype=torch.float64).reshape(-1)
    if depths.numel() == 0 or bool(
        ((depths < 0) | (depths > 1) | depths.isnan()).any()
    ):
        raise ValueError("depths must be one or more fractions in [0, 1]")
    n = len(depths)
    keys = torch.randint(ord("0"), ord("9") + 1, (n, digits), generator=generator)
    offsets = torch.randint(0, len(FILLER), (n,), generator=generator)
    filler_bytes = torch.tensor(
        list(FILLER * (filler_len // len(FILLER) + 2)), dtype=torch.long
    )
    inputs = torch.empty(n, length, dtype=torch.long)
    targets = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
    for row in range(n):
        filler = filler_bytes[offsets[row] : offsets[row] + filler_len]
        at = int(round(float(depths[row]) * filler_len))
        key = torch.cat((torch.tensor([KEY_MARK]), keys[row]))
        question = torch.cat((torch.tensor([QUERY_MARK]), keys[row]))
        inputs[row] = torch.cat((filler[:at], key, filler[at:], question))
        targets[row, length - digits - 1 : length - 1] = keys[row]
    return inputs, targets, keys


def training_batches(length: int, batch_size: int, seed: int, digits: int = 4):
    """`batches(step)` for posenc.train: keys at uniformly random depths, deterministic
    per (seed, step).
    """
    positive_int("batch_size", batch_size)

    def batches(step: int):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        depths = torch.rand(batch_size, generator=gen, dtype=torch.float64)
        inputs, targets, _ = passkey_batch(length, depths, gen, digits)
        return inputs, targets

    return batches


def test_batch(
    length: int, depth: float, count: int = 64, seed: int = 12345, digits: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed (inputs, targets) of the test at one length and depth: the same for
    every model.
    """
    positive_int("count", count)
    if not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
        raise ValueError(f"depth must be a fraction in [0, 1], got {depth!r}")
    gen = torch.Generator().manual_seed(seed + length * 1000 + int(round(depth * 100)))
    inputs, targets, _ = passkey_batch(length, [depth] * count, gen, digits)
    return inputs, targets


@torch.no_grad()
def passkey_correct(
    model,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    batch_size: int = 64,
    device=None,
) -> torch.Tensor:
    """Boolean per sequence: is every key digit the model's argmax (exact match)?"""
    device = next(model.parameters()).device if device is None else device
    out = []
    for at in range(0, len(inputs), batch_size):
        x, y = inputs[at : at + batch_size], targets[at : at + batch_size]
        predicted = model(x.to(device)).argmax(-1).cpu()
        out.append(((predicted == y) | (y == IGNORE_INDEX)).all(dim=-1))
    return torch.cat(out)


def passkey_accuracy(
    model,
    length: int,
    depth: float,
    count: int = 64,
    seed: int = 12345,
    digits: int = 4,
    device=None,
) -> float:
    """Fraction of `count` sequences whose every key digit is the model's argmax (exact
    match).
    """
    inputs, targets = test_batch(length, depth, count, seed, digits)
    return float(passkey_correct(model, inputs, targets, device=device).double().mean())
