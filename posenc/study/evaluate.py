"""Evaluation on matched text: every evaluation length scores the same target bytes.

Two protocols, both over fixed sequences of the validation split (the same for every
scheme, seed and length):

* `matched`: a sequence of 8L bytes (the longest evaluation length) is scored whole,
  and again as 2, 4, 8 consecutive windows of 4L, 2L, L bytes. Every length then
  predicts the same 8L target bytes, so a difference between lengths is the model's,
  not the text's. Reported per sequence and per position bucket of width L (positions
  counted inside the window of the longest length: bucket b of length n is scored with
  n's windows).
* `sliding` (Press et al., Appendix B): the same K target bytes are predicted with a
  window of n bytes that slides by `stride`; each window scores only its last `stride`
  targets, so every target is predicted from between n - stride + 1 and n bytes
  (itself included, the byte before it). At n = L that is the most a model trained at
  L has ever seen; a longer n only adds context far back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import positive_int


def spaced_starts(size: int, length: int, count: int) -> torch.Tensor:
    """Where `count` evenly spaced slices of `length` bytes start in data of `size`
    bytes (the first at 0, the last at the end).
    """
    positive_int("count", count)
    positive_int("length", length)
    if size < length:
        raise ValueError(
            f"data of {size} bytes is too short for {count} sequences of {length} bytes"
        )
    return torch.linspace(0, size - length, count).long()


def spaced_sequences(data: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """`count` evenly spaced, non-random slices of `length` bytes (int64), spanning the
    whole of `data` (see spaced_starts).
    """
    starts = spaced_starts(len(data), length, count)
    return torch.stack([data[s : s + length] for s in starts.tolist()]).long()


@torch.no_grad()
def token_losses(
    model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 64
) -> torch.Tensor:
    """Cross-entropy (nats) of every target, (rows, length), computed in chunks of rows
    on the model's device.
    """
    device = next(model.parameters()).device
    out = []
    for at in range(0, len(inputs), batch_size):
        logits = model(inputs[at : at + batch_size].to(device))
        out.append(
            F.cross_entropy(
                logits.transpose(1, 2).float(),
                targets[at : at + batch_size].to(device),
                reduction="none",
            ).cpu()
        )
    return torch.cat(out).double()


def matched_losses(
    model, sequences: torch.Tensor, length: int, batch_tokens: int = 65536
) -> torch.Tensor:
    """Per-target loss (N, T) of sequences (N, T + 1), scored as consecutive windows of
    `length` bytes.

    T must be a multiple of `length`. The same (N, T) targets for every length.
    """
    n, total = sequences.shape[0], sequences.shape[1] - 1
    if total % length:
        raise ValueError(
            f"the scored span ({total} bytes) must be a multiple of the window length "
            f"{length}"
        )
    x = sequences[:, :-1].reshape(-1, length)
    y = sequences[:, 1:].reshape(-1, length)
    return token_losses(model, x, y, batch_size=max(1, batch_tokens // length)).reshape(
        n, total
    )


def sliding_losses(
    model,
    sequences: torch.Tensor,
    length: int,
    targets: int,
    stride: int,
    batch_tokens: int = 65536,
) -> torch.Tensor:
    """Per-target loss (N, targets) of the last `targets` bytes of each sequence,
    windows of `length` sliding by `stride`.

    sequences are (N, C + targets + 1) with C >= length - stride: every window has all
    its context.
    """
    if targets % stride or stride > length:
        raise ValueError(
            f"targets ({targets}) must be a multiple of stride ({stride}), and stride "
            f"at most the length ({length})"
        )
    context = sequences.shape[1] - 1 - targets
    if context < length - stride:
        raise ValueError(
            f"sequences hold {context} bytes of context, the windows need "
            f"{length - stride}"
        )
    ends = [
        context + stride * (m + 1) for m in range(targets // stride)
    ]  # exclusive end of each window's inputs
    x = torch.stack([sequences[:, e - length : e] for e in ends], 1).reshape(-1, length)
    y = torch.stack([sequences[:, e - length + 1 : e + 1] for e in ends], 1).reshape(
        -1, length
    )
    losses = token_losses(model, x, y, batch_size=max(1, batch_tokens // length))[
        :, -stride:
    ]
    return losses.reshape(len(sequences), targets)
