"""Where chapters run: CUDA when there is one, the CPU otherwise."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """torch.device('cuda') when a GPU is available, else torch.device('cpu')."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
