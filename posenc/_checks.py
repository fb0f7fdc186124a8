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
    """A positive int, even where `even` (the reason, said in the error) is given."""
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
            f"{name} must be a non-negative integer, "
            f"got {value!r} ({type(value).__name__})"
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
        names = ", ".join(repr(a) for a in accepted)
        raise ValueError(f"{name} must be one of {names}; got {value!r}")
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
            f"{name} must be a tensor, a sequence or a number, "
            f"got {type(positions).__name__}"
        )
    else:
        try:
            t = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"{name} must be a tensor, a sequence or a number, got {positions!r}"
            ) from None
    if t.dtype == torch.bool or t.is_complex():
        kind = "integers" if integer else "real numbers"
        raise TypeError(f"{name} must be {kind}, got dtype {t.dtype}")
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


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Queries, keys and values of posenc.attention: 4-D, agreeing where they must."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must have shape (batch, heads, seq_len, head_dim), got {shape}"
            )
    if k.shape != v.shape[:-1] + (k.shape[-1],) or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            "k and v must agree on (batch, heads, seq_len): "
            f"got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} "
            "must agree on batch, heads and head_dim"
        )


def check_mask(mask, q_len: int, k_len: int) -> None:
    """A boolean mask that broadcasts to (batch, heads, q_len, k_len), or None."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            "mask must be a boolean tensor, True where a query may attend to a key"
        )
    try:
        torch.broadcast_shapes(mask.shape, (1, 1, q_len, k_len))
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to "
            f"(batch, heads, {q_len}, {k_len})"
        ) from None


def check_scheme_mask(scheme, causal: bool, batch: int) -> None:
    """A scheme's own mask fits the call: causal=False for one that sees later keys,
    and the batch of a per-row mask."""
    if scheme.sees_later_keys and causal:
        raise ValueError(
            f"scheme {scheme.name!r} has a mask that lets queries see later keys "
            f"({scheme.mask_key()[0]}), which causal=True would remove: "
            "pass causal=False (the mask is causal itself where it should be)"
        )
    if scheme.mask_rows is not None and scheme.mask_rows != batch:
        raise ValueError(
            f"scheme {scheme.name!r} has a mask for a batch of {scheme.mask_rows} "
            f"sequences, but q has batch {batch}"
        )
