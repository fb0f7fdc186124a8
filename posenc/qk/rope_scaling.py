"""RoPE frequency schedules: one function per `rope_type`, as in `modeling_rope_utils`.

Each function, like Hugging Face's, takes `(head_dim, base, dtype, **params)` and
returns `(inv_freq, attention_factor)`: inv_freq of length head_dim / 2, formed in
`dtype` with the operations in Hugging Face's order (so float32 reproduces transformers
bit for bit, and float64 is the closer to the formula), and the factor that multiplies
cos and sin (so the logits scale by its square). Parameter names and meanings follow
Hugging Face's RoPE configs, so a config maps to a call.
"""

from __future__ import annotations

import inspect
import math

import torch

from .._checks import PAIRS, choice, positive_float, positive_int


def default_inv_freq(
    head_dim: int, base: float, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """base^(-2i/head_dim), formed in `dtype` as transformers forms it in float32."""
    return 1.0 / (
        base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim)
    )


def _factor(factor) -> float:
    return positive_float("factor", factor, minimum=1.0, inclusive=True)


def _original(original_max_position_embeddings, rope_type: str) -> int:
    if original_max_position_embeddings is None:
        raise ValueError(
            f"rope_type {rope_type!r} needs original_max_position_embeddings "
            "(the pretraining context length)"
        )
    return positive_int(
        "original_max_position_embeddings", original_max_position_embeddings
    )


def default(
    head_dim: int, base: float, dtype: torch.dtype
) -> tuple[torch.Tensor, float]:
    """Plain RoPE (Su et al.)."""
    return default_inv_freq(head_dim, base, dtype), 1.0


def linear(
    head_dim: int, base: float, dtype: torch.dtype, factor: float
) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al., 2023): every frequency divided by `factor`,
    i.e. positions m / factor."""
    return default_inv_freq(head_dim, base, dtype) / _factor(factor), 1.0


def ntk_base(head_dim: int, base: float, factor: float) -> float:
    """NTK-aware base: base * factor^(d / (d - 2)), so the lowest frequency is divided
    by exactly `factor`."""
    positive_int("head_dim", head_dim, even=PAIRS)
    if head_dim < 4:
        raise ValueError(
            "NTK-aware scaling needs head_dim >= 4 (it raises to d / (d - 2)), "
            f"got {head_dim}"
        )
    return base * _factor(factor) ** (head_dim / (head_dim - 2))


def ntk(
    head_dim: int, base: float, dtype: torch.dtype, factor: float
) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling (bloc97, 2023): plain RoPE, the base raised to ntk_base.

    The highest frequency (i = 0) is unchanged, the lowest (i = d/2 - 1) divided by
    `factor`, and those between by a geometric blend. Not a Hugging Face rope_type:
    there it exists only in its dynamic form.
    """
    return default_inv_freq(head_dim, ntk_base(head_dim, base, factor), dtype), 1.0


def dynamic(
    head_dim: int,
    base: float,
    dtype: torch.dtype,
    factor: float,
    max_position_embeddings: int,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Dynamic NTK (emozilla, 2023), as Hugging Face computes it for the current length.

    The current length is `seq_len`. Below max_position_embeddings it is plain RoPE;
    past it the base becomes
    base * (factor * seq_len / max_position_embeddings - (factor - 1))^(d / (d - 2)),
    so the frequencies change as the sequence grows.
    """
    factor = _factor(factor)
    max_len = positive_int("max_position_embeddings", max_position_embeddings)
    seq_len = (
        max_len if seq_len is None else max(positive_int("seq_len", seq_len), max_len)
    )
    if head_dim < 4:
        raise ValueError(f"dynamic NTK scaling needs head_dim >= 4, got {head_dim}")
    ratio = factor * seq_len / max_len - (factor - 1)
    scaled = base * ratio ** (head_dim / (head_dim - 2))
    return default_inv_freq(head_dim, scaled, dtype), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(scale) + 1 (1 if scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_dim(
    num_rotations: float,
    head_dim: int,
    base: float,
    original_max_position_embeddings: int,
) -> float:
    """The real-valued pair index i whose wavelength fits `num_rotations` times into
    the original context.

    Solves original_max_position_embeddings / (2 pi base^(2i/d)) = num_rotations for i.
    """
    return (
        head_dim
        * math.log(original_max_position_embeddings / (num_rotations * 2 * math.pi))
        / (2 * math.log(base))
    )


def yarn_ramp(
    head_dim: int,
    base: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """NTK-by-parts blend per pair, in float32: 0 keeps the original frequency, 1
    interpolates it fully.

    Pairs that rotate more than beta_fast times within the original context keep
    their frequency; pairs that rotate fewer than beta_slow times are divided by
    the factor; a linear ramp joins the two. The bounds are floored and ceiled
    (truncate=True) and clamped to [0, head_dim - 1] as Hugging Face and the YaRN
    code do (head_dim - 1, not head_dim/2 - 1: a clamp that rarely binds).
    """
    low = yarn_correction_dim(
        beta_fast, head_dim, base, original_max_position_embeddings
    )
    high = yarn_correction_dim(
        beta_slow, head_dim, base, original_max_position_embeddings
    )
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as in the reference, to avoid dividing by zero
    ramp = (torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)
    return ramp.clamp(0, 1)


def yarn(
    head_dim: int,
    base: float,
    dtype: torch.dtype,
    original_max_position_embeddings: int | None = None,
    factor: float | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
    max_position_embeddings: int | None = None,
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al., 2023): NTK-by-parts frequencies and the attention temperature.

    Without `factor`, it is max_position_embeddings / original_max_position_embeddings.
    Without `attention_factor`, it is 0.1 ln(factor) + 1 (or the mscale /
    mscale_all_dim ratio of DeepSeek's configs), applied to cos and sin once, so
    the logits scale by its square.
    """
    original = _original(original_max_position_embeddings, "yarn")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError(
                "rope_type 'yarn' needs factor, or max_position_embeddings to derive "
                "it from"
            )
        max_len = positive_int("max_position_embeddings", max_position_embeddings)
        factor = max_len / original
    factor = _factor(factor)
    beta_fast = positive_float("beta_fast", beta_fast)
    beta_slow = positive_float("beta_slow", beta_slow)
    if beta_fast < beta_slow:
        raise ValueError(
            "beta_fast must not be below beta_slow (rotations: fast pairs keep their "
            f"frequency; equal: a hard cut), got beta_fast={beta_fast}, "
            f"beta_slow={beta_slow}"
        )
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(
                factor, mscale_all_dim
            )
        else:
            attention_factor = yarn_mscale(factor)
    attention_factor = positive_float("attention_factor", attention_factor)
    pos_freqs = base ** (
        torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    )
    ramp = yarn_ramp(head_dim, base, original, beta_fast, beta_slow, truncate)
    keep = 1 - ramp.to(dtype)  # the ramp in float32, as the reference
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep
    return inv_freq, float(attention_factor)


def _per_pair(name: str, values, head_dim: int) -> list[float]:
    """One positive, finite rescale factor per rotated pair (LongRoPE's short_factor
    and long_factor)."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(
            f"{name} must be a list of head_dim / 2 = {head_dim // 2} numbers (one per "
            f"rotated pair), got {type(values).__name__}"
        )
    if len(values) != head_dim // 2:
        raise ValueError(
            f"{name} must have head_dim / 2 = {head_dim // 2} entries, one per rotated "
            f"pair, got {len(values)}"
        )
    return [positive_float(f"{name}[{i}]", v) for i, v in enumerate(values)]


def longrope(
    head_dim: int,
    base: float,
    dtype: torch.dtype,
    short_factor,
    long_factor,
    original_max_position_embeddings: int | None = None,
    factor: float | None = None,
    attention_factor: float | None = None,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Ding et al., 2024) as Phi-3 ships it: searched factors, short or long.

    theta_i / short_factor[i] for sequences up to original_max_position_embeddings,
    theta_i / long_factor[i] when the current length `seq_len` is past it (the switch
    Hugging Face makes on max(position_ids) + 1). Without `factor`, it is
    max_position_embeddings / original_max_position_embeddings; without
    `attention_factor`, it is sqrt(1 + ln(factor) / ln(original)) (1 for factor <= 1),
    multiplying cos and sin for both sets.
    """
    original = _original(original_max_position_embeddings, "longrope")
    short = _per_pair("short_factor", short_factor, head_dim)
    long = _per_pair("long_factor", long_factor, head_dim)
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError(
                "rope_type 'longrope' needs factor, or max_position_embeddings to "
                "derive it from"
            )
        max_len = positive_int("max_position_embeddings", max_position_embeddings)
        factor = max_len / original
    factor = positive_float("factor", factor)
    if attention_factor is None:
        boost = math.log(factor) / math.log(original) if factor > 1.0 else 0.0
        attention_factor = math.sqrt(1 + boost)
    attention_factor = positive_float("attention_factor", attention_factor)
    is_long = seq_len is not None and positive_int("seq_len", seq_len) > original
    ext_factors = torch.tensor(long if is_long else short, dtype=dtype)
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    return 1.0 / (ext_factors * base**exponent), float(attention_factor)


def llama3(
    head_dim: int,
    base: float,
    dtype: torch.dtype,
    factor: float,
    original_max_position_embeddings: int | None = None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> tuple[torch.Tensor, float]:
    """Llama 3.1's scaling: wavelength bands with a smooth blend between them.

    Wavelengths shorter than original / high_freq_factor keep their frequency;
    longer than original / low_freq_factor are divided by `factor`; in between,
    a blend linear in original / wavelength. With low_freq_factor ==
    high_freq_factor there is no band between: a hard cut at original /
    low_freq_factor (Llama 4 Scout ships low = high = 1). Hugging Face computes that
    case too, its blend a 0/0 that only a wavelength exactly on the cut would pick;
    here that one keeps its frequency.
    """
    factor = _factor(factor)
    original = _original(original_max_position_embeddings, "llama3")
    low = positive_float("low_freq_factor", low_freq_factor)
    high = positive_float("high_freq_factor", high_freq_factor)
    if low > high:
        raise ValueError(
            "low_freq_factor must not exceed high_freq_factor (equal: a hard cut), got "
            f"low_freq_factor={low}, high_freq_factor={high}"
        )
    inv_freq = default_inv_freq(head_dim, base, dtype)
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    if low == high:
        return scaled, 1.0
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(is_medium, blended, scaled), 1.0


def proportional(
    head_dim: int,
    base: float,
    dtype: torch.dtype,
    partial_rotary_factor: float = 1.0,
    factor: float = 1.0,
) -> tuple[torch.Tensor, float]:
    """p-RoPE (Barbero et al., 2025), Gemma 4's global layers: the fastest pairs turn.

    The fastest part of the full ladder turns, the rest does not: the first
    int(partial_rotary_factor * head_dim // 2) pairs keep theta_i =
    base^(-2i/head_dim), the exponent over the *whole* head; every other pair gets
    frequency 0, so it never turns (a NoPE channel). The whole head is paired, (i, i +
    head_dim/2) in the half layout. Compare partial_rotary_factor in other rope_types,
    which rotates only the first dimensions with a ladder compressed onto them: on
    Gemma 4's 512-wide head at 0.25 the slowest turning pair has a wavelength of 188
    tokens here, millions there. `factor` divides every frequency, as in Hugging
    Face's `_compute_proportional_rope_parameters`.
    """
    fraction = positive_float(
        "partial_rotary_factor", partial_rotary_factor, minimum=0.0, inclusive=True
    )
    if fraction > 1.0:
        raise ValueError(
            "partial_rotary_factor must be in [0, 1] (the fraction of the ladder that "
            f"turns), got {fraction}"
        )
    turning = int(fraction * head_dim // 2)
    ladder = 1.0 / (
        base
        ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64).to(dtype) / head_dim)
    )
    inv_freq = torch.cat((ladder, torch.zeros(head_dim // 2 - turning, dtype=dtype)))
    return inv_freq / positive_float("factor", factor), 1.0


#: The frequency schedules, ``{rope_type: function}``, that `rope_frequencies` and
#: `Rope` look up: Hugging Face's `rope_type` names (``"default"``, ``"linear"``,
#: ``"dynamic"``, ``"yarn"``, ``"longrope"``, ``"llama3"``, ``"proportional"``) and the
#: static ``"ntk"``. Each function takes ``(head_dim, base, dtype, **params)`` and
#: returns ``(inv_freq, attention_factor)``; `rope_parameters` lists its parameters.
ROPE_TYPES = {
    "default": default,
    "linear": linear,
    "ntk": ntk,
    "dynamic": dynamic,
    "yarn": yarn,
    "longrope": longrope,
    "llama3": llama3,
    "proportional": proportional,
}


def rope_parameters(rope_type: str) -> dict[str, object]:
    """The parameters a rope_type takes beyond head_dim and base, with their defaults.

    A default of inspect.Parameter.empty marks a required parameter.
    """
    choice("rope_type", rope_type, tuple(ROPE_TYPES))
    params = list(inspect.signature(ROPE_TYPES[rope_type]).parameters.values())[3:]
    return {p.name: p.default for p in params}
