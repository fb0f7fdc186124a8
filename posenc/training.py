"""The training loop the chapters use: AdamW on next-token cross-entropy."""

from __future__ import annotations

import torch
from torch import nn

from ._checks import positive_int


def train(
    model: nn.Module, batches, steps: int, lr: float = 3e-3, weight_decay: float = 0.0
) -> list[float]:
    """Train a model with AdamW on next-token cross-entropy.

    The model is in training mode while it trains and left in evaluation mode.
    Deterministic for a fixed seed and machine.

    Args:
        model: a model whose output on inputs (batch, seq_len) is logits
            (batch, seq_len, vocab_size), such as TinyTransformer.
        batches: a function of the step number returning (inputs, targets), two
            integer tensors (batch, seq_len); targets of -100 are ignored.
        steps: the number of optimizer steps, a positive integer.
        lr: AdamW's learning rate.
        weight_decay: AdamW's weight decay.

    Returns:
        The loss of every step, a list of `steps` floats.

    Raises:
        TypeError: `steps` is not an integer.
        ValueError: `steps` is not positive.

    Example:
        >>> import torch, posenc
        >>> _ = torch.manual_seed(0)
        >>> model = posenc.TinyTransformer(vocab_size=8, dim=16, num_heads=2)
        >>> def batches(step):  # predict the token itself: the embedding alone does it
        ...     g = torch.Generator().manual_seed(step)
        ...     tokens = torch.randint(0, 8, (4, 6), generator=g)
        ...     return tokens, tokens
        >>> losses = posenc.train(model, batches, steps=40, lr=1e-2)
        >>> len(losses), losses[-1] < losses[0] / 4, model.training
        (40, True, False)
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
