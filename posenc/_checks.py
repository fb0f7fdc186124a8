"""Argument checks shared by the public functions.

Every check raises a ValueError or TypeError whose message names the argument
and says what is accepted, so that bad input never turns into a silent NaN or a
shape error deep inside torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


PAIRS = "positions rotate pairs of dimensions"


def positive_int(name: str, value, *, even: str | None = None) -> int:
    """A positive int; `even`, when given, is the reason it must also be even (said in the error)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even ({even}), got {value}")
    return value


def non_negative_int(name: str, value, below: int | None = None) -> int:
    """An int >= 0 (a count, an offset, a seed), and below `below` when given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be a non-negative integer, got {value!r} ({type(value).__name__})"
        )
    if below is None and value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    if below is not None and not 0 <= value < below:
        raise ValueError(f"{name} must be an integer in [0, {below}), got {value}")
    return value


def positive_float(
    name: str, value, *, minimum: float = 0.0, inclusive: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number, got {value!r} ({type(value).__name__})"
        )
    value = float(value)
    ok = value >= minimum if inclusive else value > minimum
    if not math.isfinite(value) or not ok:
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


def choice(name: str, value, accepted: Sequence[str]) -> str:
    if value not in accepted:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(a) for a in accepted)}; got {value!r}"
        )
    return value


def as_positions(name: str, positions, *, integer: bool) -> torch.Tensor:
    """Turn an int, a sequence or a tensor into a tensor of positions.

    `integer=True` is for places where a position indexes something (a mask, a
    bias between token indices); `integer=False` also accepts real-valued
    positions (an interpolated RoPE or sinusoidal position is meaningful).
    """
    if isinstance(positions, torch.Tensor):
        t = positions
    elif isinstance(positions, (bool, str, bytes)) or not isinstance(
        positions, (int, float, Sequence)
    ):
        raise TypeError(
            f"{name} must be a tensor, a sequence or a number, got {type(positions).__name__}"
        )
    else:
        try:
            t = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"{name} must be a tensor, a sequence or a number, got {positions!r}"
            ) from None
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(
            f"{name} must be {'integers' if integer else 'real numbers'}, got dtype {t.dtype}"
        )
    if integer and t.is_floating_point():
        raise TypeError(f"{name} must be integers (token indices), got dtype {t.dtype}")
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite, got a non-finite value")
    return t


def same_last_dim(name: str, x: torch.Tensor, expected: int, what: str) -> None:
    if x.shape[-1] != expected:
        raise ValueError(
            f"{name} has last dimension {x.shape[-1]}, but {what} needs {expected}"
        )
