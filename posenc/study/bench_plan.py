"""The plan of a benchmark run: every measurement of a preset, in the order it runs.

`plan` lists a preset's `Task`s, each with the reason it will be skipped (or None): a
path the preset leaves out, or one whose memory estimate (`estimate_bytes`, deliberately
generous) is over the run's limit. `nominal_flops` is causal attention's work,
`choose_dtype` the dtype a device runs.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from .bench_files import COLUMNS
from .bench_paths import BACKWARD, FORWARD
from .presets import (
    BASELINE,
    BASELINE_PATHS,
    OPERATION_PATHS,
    SCHEME_PATHS,
    SDPA_BACKEND_PATHS,
    Preset,
    get_preset,
)


@dataclasses.dataclass(frozen=True)
class Task:
    """One measurement: a scheme's path, a pass, a shape, a dtype (None: the run's);
    `skip` says why it will not run."""

    scheme: str
    path: str
    pass_: str
    seq_len: int
    batch: int
    skip: str | None = None
    dtype: torch.dtype | None = None

    @property
    def dtype_name(self) -> str:
        return "" if self.dtype is None else str(self.dtype).removeprefix("torch.")


def choose_dtype(
    device: torch.device, bf16_supported: bool | None = None
) -> torch.dtype:
    """float32 on the CPU; on a GPU bfloat16 where the hardware supports it natively,
    float16 otherwise (a T4, say)."""
    if torch.device(device).type != "cuda":
        return torch.float32
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.bfloat16 if bf16_supported else torch.float16


def elt(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def nominal_flops(
    pass_: str, batch: int, heads: int, length: int, head_dim: int
) -> int:
    """FLOPs of causal attention: 2 L^2 d per head forward (half of QK^T and PV), 3.5
    times that forward+backward."""
    forward = 2 * batch * heads * length * length * head_dim
    return forward if pass_ == FORWARD else 7 * forward // 2


def estimate_bytes(
    scheme: str,
    path: str,
    pass_: str,
    batch: int,
    heads: int,
    length: int,
    head_dim: int,
    elt: int,
) -> int:
    """A deliberately generous estimate of a path's peak memory, to skip what cannot fit
    before trying it."""
    bhld = batch * heads * length * head_dim * elt
    if path.startswith("explicit") or path in ("sdpa", "flex_uncompiled"):
        estimate = (
            (7 if pass_ == BACKWARD else 4) * batch * heads * length * length * 4
            + 8 * bhld
            + 16 * length * length
        )
        if (
            path == "explicit_naive"
        ):  # the (L, L, d) relative tensors of keys and values
            estimate += (4 if pass_ == BACKWARD else 2) * length * length * head_dim * 4
        return estimate
    return 16 * bhld


def _static_skip(preset: Preset, scheme: str, path: str, pass_: str) -> str | None:
    if path in ("flex", "flex_direct") and not preset.compile_flex:
        return (
            f"compiled FlexAttention is left out of the {preset.name} preset (10-20 s "
            "of "
            "compiling per scheme and shape on a CPU; run with --compile-flex, or see "
            "the "
            "kernel preset)"
        )
    if path == "flex_uncompiled" and not preset.flex_uncompiled:
        return (
            "uncompiled FlexAttention materialises the (batch, heads, L, L) scores; "
            "the "
            f"{preset.name} preset measures the compiled path 'flex'"
        )
    if path == "hf_eager" and not preset.hf_rope:
        return (
            "Hugging Face's apply_rotary_pos_emb is left out of the "
            f"{preset.name} preset (importing transformers takes seconds)"
        )
    if scheme == "t5_computed" and pass_ != FORWARD:
        return (
            "T5's former score_mod is measured forward only, beside t5's flex row (one "
            "compile less)"
        )
    return None


def memory_limit(preset: Preset, device_memory: int | None) -> int:
    if preset.max_bytes is not None:
        return preset.max_bytes
    if device_memory is None:
        raise ValueError(
            f"preset {preset.name!r} sets no max_bytes: give device_memory (bytes)"
        )
    return device_memory // 2


def plan(
    preset: str | Preset,
    device_memory: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[Task]:
    """Every measurement of a preset, in the order it runs, each with the reason it will
    be skipped (or None).

    Per length: the copy and RoPE group (forward, in the run's dtype and each of
    `rope_dtypes`), then the attention paths of each pass. SDPA's forced backends are
    measured on a GPU only (on a CPU SDPA has one fused kernel).
    """
    preset = get_preset(preset)
    limit = memory_limit(preset, device_memory)

    def wanted(scheme: str, path: str) -> bool:
        if path in SDPA_BACKEND_PATHS and preset.device != "cuda":
            return False
        return scheme in preset.schemes and (
            preset.paths is None or path in preset.paths or (scheme, path) == BASELINE
        )

    tasks = []
    for length in (*preset.lengths, *preset.long_lengths):
        batch = preset.batch_at(length)
        for dt in (None, *(getattr(torch, name) for name in preset.rope_dtypes)):
            for scheme, paths in OPERATION_PATHS.items():
                tasks += [
                    Task(
                        scheme,
                        path,
                        FORWARD,
                        length,
                        batch,
                        _static_skip(preset, scheme, path, FORWARD),
                        dt,
                    )
                    for path in paths
                    if wanted(scheme, path)
                ]
        for scheme, paths in SCHEME_PATHS.items():
            for path in (p for p in paths if wanted(scheme, p)):
                for pass_ in preset.passes:
                    skip = _static_skip(preset, scheme, path, pass_)
                    need = estimate_bytes(
                        scheme,
                        path,
                        pass_,
                        batch,
                        preset.heads,
                        length,
                        preset.head_dim,
                        elt(dtype),
                    )
                    if skip is None and need > limit:
                        skip = (
                            f"needs about {need / 2**30:.1f} GiB by estimate, over "
                            "this "
                            f"run's limit of {limit / 2**30:.1f} GiB"
                        )
                    tasks.append(Task(scheme, path, pass_, length, batch, skip))
    return tasks


def task_row(
    preset: Preset, task: Task, dtype: torch.dtype, fractions: dict | None = None
) -> dict:
    """A measurement's row before it runs: its shape, its FLOPs and bytes, status
    skipped.

    An attention path's FLOPs are causal attention's
    (posenc.study.presets.nominal_flops), scaled for a mask that leaves fewer blocks
    than causal by its blocks over causal's (the sliding window): the work of the blocks
    a block-sparse kernel visits.
    """
    n = task.batch * preset.heads * task.seq_len * preset.head_dim
    operation = task.scheme in OPERATION_PATHS
    e = elt(task.dtype or dtype)
    if operation:
        flops = 6 * n if task.scheme == "rope" else 0
    else:
        flops = nominal_flops(
            task.pass_, task.batch, preset.heads, task.seq_len, preset.head_dim
        )
        frac = (fractions or {}).get(str(task.seq_len), {})
        if task.scheme in frac and frac.get("causal"):
            flops = round(flops * frac[task.scheme] / frac["causal"])
    row = dict.fromkeys(COLUMNS)
    row.update(
        run=1,
        preset=preset.name,
        device=preset.device,
        scheme=task.scheme,
        path=task.path,
        seq_len=task.seq_len,
        batch=task.batch,
        heads=preset.heads,
        head_dim=preset.head_dim,
        dtype=str(task.dtype or dtype).removeprefix("torch."),
        status="skipped",
        reason="",
        flops=flops,
        bytes_moved=(4 if operation or task.pass_ == FORWARD else 12) * n * e,
    )
    row["pass"] = task.pass_
    if task.path in BASELINE_PATHS:
        row["backend"] = (
            task.path.removeprefix("sdpa_")
            if task.path in SDPA_BACKEND_PATHS
            else "default"
        )
    return row


def block_fractions(
    preset: Preset, device: torch.device
) -> dict[str, dict[str, float]]:
    """Fraction of (query block, key block) pairs FlexAttention computes, causal and
    windowed, per length."""
    from torch.nn.attention.flex_attention import create_block_mask

    from ..score.masks import causal, sliding_window

    fractions = {}
    for length in sorted({*preset.lengths, *preset.long_lengths}):
        dense = {
            name: create_block_mask(
                mod, None, None, length, length, device=device.type
            ).to_dense()
            for name, mod in (
                ("causal", causal),
                ("sliding_window", sliding_window(preset.window)),
            )
        }
        fractions[str(length)] = {
            name: round(float(d.sum()) / d.numel(), 6) for name, d in dense.items()
        }
    return fractions


# set (to anything but "" or "0"): preset_here gives the tiny variant (the tests, the
# emulated device)
TINY_ENV = "POSENC_TINY"


def tiny(preset: str | Preset) -> Preset:
    """`preset` at tiny shapes: the same device, schemes, paths, passes and steps, in
    seconds.

    For a CPU or an emulated GPU. Its name gains "_tiny" (its results never overwrite
    the real preset's), Hugging Face's RoPE is left out (importing transformers takes
    seconds), and its goals are judged from its first length. Its timings mean nothing.
    """
    preset = get_preset(preset)
    base = preset.name.removesuffix("_tiny")
    return dataclasses.replace(
        preset,
        name=f"{base}_tiny",
        lengths=(64, 128),
        long_lengths=(),
        batch=1,
        tokens=None,
        heads=2,
        head_dim=16,
        window=16,
        shaw_max_distance=4,
        t5_buckets=8,
        t5_max_distance=32,
        warmup=1,
        repeats=3,
        op_repeats=None,
        min_calls=min(preset.min_calls, 2),
        min_sample_ms=0.0,
        op_sample_ms=0.0,
        steady_allocator=False,
        matmul_size=64,
        l2_flush_bytes=2**16 if preset.device == "cuda" else None,
        hf_rope=False,
        max_bytes=2**28,
        time_budget_s=300.0,
        goal_length=64,
        description=f"{base} at tiny shapes (L = 64 and 128, 2 heads of width 16), for "
        "tests: its timings mean nothing.",
    )


def preset_here(name: str | Preset) -> Preset:
    """The preset to run here: `name`'s, or its tiny variant where $POSENC_TINY is set
    (the tests set it on the emulated GPU)."""
    preset = get_preset(name)
    return tiny(preset) if os.environ.get(TINY_ENV, "") not in ("", "0") else preset
