"""Small synthetic tasks where order matters, to train `posenc.TinyTransformer` in
seconds.

A task is a pure function of a step number and a seed: the same arguments give the same
batch on every machine and device (tokens are drawn on the CPU with a private generator,
then moved to `device`), and nothing touches torch's global random state.
`lag_copy_batches` fixes the arguments and returns the `batches(step)` callable that
`posenc.train` takes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._checks import non_negative_int, positive_int

IGNORE_INDEX = (
    -100
)  # targets with this value are skipped by cross_entropy, hence by posenc.train
# torch's CPU generator keeps only the low 32 bits of a seed: (seed, step) is packed
# into 32 bits, one to one
SEED_BITS, STEP_BITS = 10, 22


def _device(device) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            "device must be None, a string or a torch.device, got "
            f"{type(device).__name__}"
        )
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"device must name a torch device such as 'cpu' or 'cuda', got {device!r}"
        ) from None


def lag_copy(
    step: int,
    vocab_size: int = 16,
    length: int = 64,
    batch_size: int = 16,
    lag: int = 4,
    seed: int = 0,
    device=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of the lag-copy task: at every position i >= lag, predict the token at
    position i - lag.

    Returns `(inputs, targets)`, two int64 tensors of shape (batch_size, length). The
    inputs are uniform random tokens in [0, vocab_size); `targets[:, i] = inputs[:, i -
    lag]` for i >= lag, and -100 (ignored by the loss) for i < lag.

    The answer is a token at a fixed *distance*, and every token is equally likely
    everywhere, so content alone cannot solve it: a model must know where each token is.
    `step` (0 <= step < 2**22) and `seed` (0 <= seed < 1024) pick the batch, and no two
    pairs share a generator seed; use a seed not used in training for held-out batches,
    and a larger `length` to test positions never trained.
    """
    non_negative_int("step", step, 2**STEP_BITS)
    non_negative_int("seed", seed, 2**SEED_BITS)
    if positive_int("vocab_size", vocab_size) < 2:
        raise ValueError(
            "vocab_size must be at least 2 (one token carries no information), got "
            f"{vocab_size}"
        )
    positive_int("batch_size", batch_size)
    if positive_int("length", length) <= positive_int("lag", lag):
        raise ValueError(
            "length must exceed lag (no position would have a target), got "
            f"length={length}, lag={lag}"
        )
    gen = torch.Generator().manual_seed((seed << STEP_BITS) + step)
    inputs = torch.randint(0, vocab_size, (batch_size, length), generator=gen)
    targets = torch.full_like(inputs, IGNORE_INDEX)
    targets[:, lag:] = inputs[:, :-lag]
    dev = _device(device)
    return inputs.to(dev), targets.to(dev)


def lag_copy_batches(
    vocab_size: int = 16,
    length: int = 64,
    batch_size: int = 16,
    lag: int = 4,
    seed: int = 0,
    device=None,
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """`batches(step)` for `posenc.train`: `lag_copy` with every argument but the step
    fixed.

    The arguments are checked here, once, so a mistake fails before training starts.
    """
    kwargs = dict(
        vocab_size=vocab_size,
        length=length,
        batch_size=batch_size,
        lag=lag,
        seed=seed,
        device=device,
    )
    lag_copy(0, **kwargs)  # checks the arguments

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return lag_copy(step, **kwargs)

    return batches
