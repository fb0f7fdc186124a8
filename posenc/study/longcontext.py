"""A probe where context beyond the training length can help: copying a segment whose
earlier copy lies far back.

Every probe sequence is a window of real validation text whose last `segment` bytes
are replaced by a segment S taken from elsewhere in the split (the control); for each
distance D, a copy of the sequence also has S written D bytes earlier (D counted from
the start of the earlier copy to the start of the last one). The model scores the last
`segment` bytes with one window of n bytes that ends at them, as the sliding protocol
does (posenc.study.evaluate.sliding_losses): the earlier copy lies in the window when
n >= D + segment, and outside it otherwise, where the copy and the control show the
model the very same bytes. The copy gain, control loss minus copy loss on the same
targets, is then zero by construction while the earlier copy is out of sight, and
measures how much the model uses it once it is in sight.

With segment = L/2 and D = fL - L/2 for every evaluation factor f, the earlier copy
comes into sight exactly at n = fL: at n = L it is half a training length back (a
distance seen in training), at n = 2L, 4L, 8L it lies 1.5L, 3.5L, 7.5L back, where only
a model that uses context beyond L can gain from it.

A *reversed* copy writes the earlier segment back to front: the same bytes, in an order
that cannot be followed. A model that gains from it as much as from the copy reads the
earlier bytes as a bag (which bytes are about), not as a sequence to copy.
"""

from __future__ import annotations

import torch

from .._checks import positive_int
from .evaluate import sliding_losses, spaced_starts


def probe_distances(train_len: int, factors, segment: int) -> dict[int, int]:
    """Evaluation length -> the distance D whose earlier copy enters a window of that
    length (D = n - segment)."""
    return {f * train_len: f * train_len - segment for f in factors}


def probe_sequences(
    valid: torch.Tensor,
    count: int,
    length: int,
    segment: int,
    distances,
    reverse: bool = False,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """(control, {D: copy}): int64 sequences (count, length + 1) of the validation
    split, with a segment from elsewhere as their last `segment` bytes (and, in each
    copy, D bytes earlier too: back to front with `reverse`).

    The windows are evenly spaced over the split; sequence z's segment is the first
    `segment` bytes of window (z + count // 2) mod count, another part of the split.
    """
    positive_int("count", count)
    if not 0 < segment <= min(distances, default=segment) or max(distances) > length:
        raise ValueError(
            f"distances must lie in [segment, length] = [{segment}, {length}], got "
            f"{sorted(distances)}"
        )
    starts = spaced_starts(len(valid), length + 1, max(count, 2))[:count]
    windows = torch.stack([valid[s : s + length + 1] for s in starts.tolist()]).long()
    if count == 1:  # one window: its segment from the other end of the split
        source = valid[-segment:].long()[None]
    else:
        source = windows.roll(-(count // 2), 0)[:, :segment]
    control = windows.clone()
    control[:, -segment:] = source
    copies = {}
    for d in distances:
        copy = control.clone()
        end = length + 1 - d  # where the earlier copy ends (exclusive)
        copy[:, end - segment : end] = source.flip(1) if reverse else source
        copies[d] = copy
    return control, copies


def segment_losses(model, sequences: torch.Tensor, n: int, segment: int):
    """Loss (rows, segment) of the last `segment` bytes, with one window of n bytes
    ending at them."""
    return sliding_losses(model, sequences, n, segment, segment)
