"""Where chapters run: CUDA when there is one, the CPU otherwise."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """The device the chapters run on: CUDA where a GPU is available, else the CPU.

    Returns:
        ``torch.device("cuda")`` where torch.cuda.is_available(), else
        ``torch.device("cpu")``. Never raises.

    Example:
        >>> import torch, posenc
        >>> device = posenc.default_device()
        >>> device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        True
        >>> posenc.Rope(head_dim=8).to(device).inv_freq.device.type == device.type
        True
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
