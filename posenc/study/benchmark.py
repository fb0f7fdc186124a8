"""What positions cost: time and peak memory of every kernel path a scheme can take.

    python -m posenc.benchmark --preset cpu [--out chapters/results]
    python -m posenc.benchmark --preset gpu [--out chapters/results]

writes ``benchmark_<preset>.csv`` (one row per measurement, the columns of `COLUMNS`)
and ``benchmark_<preset>.json`` (device, versions, commit, date, the preset itself).

The attention paths, each given the same queries, keys and values:

* ``explicit``: `posenc.attention(backend="explicit")`, which materialises the
  (batch, heads, L, L) scores in float32 (and, for Shaw's naive method, an (L, L, d) tensor);
* ``sdpa_mask``: `posenc.attention(backend="sdpa")`: the bias and mask folded into one
  additive float mask, materialised, then `scaled_dot_product_attention`;
* ``flex_eager``: `posenc.attention(backend="flex")`, FlexAttention uncompiled (it materialises the scores);
* ``flex``: FlexAttention compiled, with the scheme's `score_mod` and a block mask built once per
  length from a pure function of the indices (causal, or `posenc.masks.window_mask_mod`);
* ``flex_inkernel`` (T5 only): as ``flex`` but with T5's bucket computed inside the kernel from
  `kv_idx - q_idx` instead of read from an (L, L) table;
* ``sdpa_causal``: the baseline every ratio is taken against, `scaled_dot_product_attention(is_causal=True)`
  (the FlashAttention backend on a GPU).

Schemes that act outside the kernel (sinusoidal, learned, RoPE and its rescalings) share the
baseline kernel; RoPE's own operation is timed separately (``rope``: posenc's `apply_rope`,
the same compiled, and Hugging Face's eager `apply_rotary_pos_emb`), with a copy of the same
bytes (``copy``) and a matrix product (``matmul``) measured in the same run as the device's
bandwidth and compute references.

Each path is first checked against the explicit path (outputs, and gradients for the
forward+backward pass) and only then timed: medians and quartiles of repeated calls after a
warm-up, `time.perf_counter` on the CPU and CUDA events on a GPU. A path the device or this
torch cannot run is recorded as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from .attention import attention
from .masks import window_mask_mod
from .memory import cuda_peak_memory, peak_memory
from .relative import t5_relative_bucket
from .rope import apply_rope, rope_frequencies
from .runinfo import cpu_model, git_state, load_average
from .schemes import ALiBi, NoPE, Scheme, ShawRelative, SlidingWindow, T5Bias

FORWARD, BACKWARD = "forward", "forward+backward"
PASSES = (FORWARD, BACKWARD)

COLUMNS = (
    "preset", "scheme", "path", "pass", "seq_len", "batch", "heads", "head_dim", "dtype",
    "median_ms", "q25_ms", "q75_ms", "peak_mem_bytes", "status", "reason",
    "flops", "bytes_moved", "check_seq_len", "max_abs_err", "repeats",
)  # fmt: skip

BASELINE = ("nope", "sdpa_causal")  # (scheme, path) every ratio is taken against

# the kernel paths of each scheme, in the order they are measured
SCHEME_PATHS: dict[str, tuple[str, ...]] = {
    "nope": ("sdpa_causal", "explicit", "sdpa_mask", "flex_eager", "flex"),
    "alibi": ("explicit", "sdpa_mask", "flex_eager", "flex"),
    "t5": ("explicit", "sdpa_mask", "flex_eager", "flex", "flex_inkernel"),
    "shaw": ("explicit", "sdpa_mask", "flex_eager", "flex"),
    "sliding_window": ("explicit", "sdpa_mask", "flex_eager", "flex"),
    "shaw_values": ("explicit_naive", "explicit_gather"),
}
# operations outside the attention kernel, timed forward only
OPERATION_PATHS: dict[str, tuple[str, ...]] = {
    "copy": ("clone",),
    "rope": ("posenc", "posenc_compiled", "hf_eager"),
}
ALL_SCHEMES = (*SCHEME_PATHS, *OPERATION_PATHS)
# the path each path is checked against
REFERENCE = {"shaw_values": "explicit_naive", "rope": "posenc", "copy": "clone"}
FLEX_PATHS = ("flex", "flex_inkernel")
# float32: atol = rtol of torch.testing.assert_close; half precision: the norm-wise relative error
# ||got - reference|| / ||reference||, which a sum over many bfloat16 terms (a bias's gradient) still meets
TOLERANCE = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@dataclasses.dataclass(frozen=True)
class Preset:
    """What one run measures, and how."""

    name: str
    device: str  # "cpu" or "cuda"
    lengths: tuple[int, ...]
    batch: int
    heads: int
    head_dim: int
    long_lengths: tuple[int, ...] = ()  # measured with batch 1
    warmup: int = 1
    repeats: int = 5
    threads: int | None = None  # torch.set_num_threads for the run; None leaves it as it is
    window: int = 256  # sliding window: keys each query sees, itself included
    shaw_max_distance: int = 16
    t5_buckets: int = 32
    t5_max_distance: int = 128
    matmul_size: int = 1024
    compile_flex: bool = True
    flex_eager: bool = True
    compile_rope: bool = True
    hf_rope: bool = True
    compile_backend: str = "inductor"
    compile_dynamic: bool | None = None  # torch.compile's `dynamic`
    max_bytes: int | None = None  # estimated peak above which a path is skipped; None: half the GPU's memory
    time_budget_s: float = 600.0
    description: str = ""


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu", "cpu", (256, 512, 1024, 2048), batch=1, heads=4, head_dim=64, warmup=1, repeats=5, threads=1,
        window=256, matmul_size=1024, compile_flex=False, flex_eager=True, max_bytes=3 * 2**30, time_budget_s=600.0,
        description="One CPU thread (torch.set_num_threads(1)), float32; FlexAttention runs uncompiled only.",
    ),
    "gpu": Preset(
        "gpu", "cuda", (512, 1024, 2048, 4096, 8192, 16384), batch=4, heads=16, head_dim=64, long_lengths=(32768,),
        warmup=3, repeats=10, window=1024, matmul_size=8192, compile_flex=True, flex_eager=False, time_budget_s=570.0,
        description="One GPU, bf16 where supported (fp16 otherwise); compiled FlexAttention; 32k tokens at batch 1.",
    ),
    "tiny": Preset(
        "tiny", "cpu", (64, 128), batch=1, heads=2, head_dim=16, warmup=0, repeats=3, threads=1, window=16,
        shaw_max_distance=4, t5_buckets=8, t5_max_distance=32, matmul_size=64, hf_rope=False,
        compile_backend="aot_eager", max_bytes=2**28, time_budget_s=120.0,
        description="Seconds on a CPU, for tests and the chapter's live run: every code path, tiny shapes; "
        "torch.compile with the aot_eager backend (traced, no code generated).",
    ),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Task:
    """One measurement: a scheme's path, a pass, a shape; `skip` says why it will not run."""

    scheme: str
    path: str
    pass_: str
    seq_len: int
    batch: int
    skip: str | None = None


class SkipPath(Exception):
    """A path that cannot run here; the message is the reason recorded."""


# --------------------------------------------------------------------------- configuration


def get_preset(preset: str | Preset) -> Preset:
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(repr(p) for p in PRESETS)}; got {preset!r}")
    return PRESETS[preset]


def choose_dtype(device: torch.device, bf16_supported: bool | None = None) -> torch.dtype:
    """float32 on the CPU; on a GPU bfloat16 where the hardware supports it natively, float16 otherwise (a T4, say)."""
    if torch.device(device).type != "cuda":
        return torch.float32
    if bf16_supported is None:  # native support (compute capability 8.0 and up), not emulation: a T4 gets float16
        try:
            bf16_supported = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # an older torch without the argument
            bf16_supported = torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16_supported else torch.float16


def resolve_device(preset: Preset) -> torch.device:
    if preset.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"preset {preset.name!r} needs a CUDA device and none is available here; run --preset cpu")
    return torch.device(preset.device)


def _elt(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def nominal_flops(pass_: str, batch: int, heads: int, length: int, head_dim: int) -> int:
    """FLOPs of causal attention: 2 L^2 d per head forward (half of QK^T and PV), 3.5 times that forward+backward."""
    forward = 2 * batch * heads * length * length * head_dim
    return forward if pass_ == FORWARD else 7 * forward // 2


def minimal_bytes(pass_: str, batch: int, heads: int, length: int, head_dim: int, elt: int) -> int:
    """The fewest bytes any attention kernel moves: read q, k, v and write o (forward), plus 8 such tensors backward."""
    return (4 if pass_ == FORWARD else 12) * batch * heads * length * head_dim * elt


def _index_bytes(scheme: str, length: int) -> int:
    """Rough bytes of the (L, L) index tensors posenc builds on the way (distances, buckets, masks)."""
    return {"t5": 40, "shaw": 24, "shaw_values": 24}.get(scheme, 16) * length * length


def estimate_bytes(scheme: str, path: str, pass_: str, batch: int, heads: int, length: int, head_dim: int, elt: int) -> int:
    """A deliberately generous estimate of a path's peak memory, to skip what cannot fit before trying it."""
    bhld = batch * heads * length * head_dim * elt
    backward = pass_ == BACKWARD
    if path in ("explicit", "explicit_gather", "explicit_naive", "sdpa_mask", "flex_eager"):
        scores = batch * heads * length * length * 4  # one float32 (B, H, L, L) tensor
        estimate = (7 if backward else 4) * scores + 8 * bhld + _index_bytes(scheme, length)
        if path == "explicit_naive":  # the (L, L, d) relative tensors of keys and values
            estimate += (4 if backward else 2) * length * length * head_dim * 4
        return estimate
    if path == "flex" and scheme in ("t5", "shaw"):
        return 16 * bhld + _index_bytes(scheme, length)  # posenc's score_mod reads an (L, L) index
    return 16 * bhld


def plan(preset: str | Preset, device_memory: int | None = None, dtype: torch.dtype = torch.float32) -> list[Task]:
    """Every measurement of a preset, in the order it runs, each with the reason it will be skipped (or None).

    Needs no device: `device_memory` (bytes) stands for the GPU's memory when the
    preset sets no `max_bytes`, so the plan of the gpu preset can be checked on a CPU.
    """
    preset = get_preset(preset)
    limit = preset.max_bytes
    if limit is None:
        if device_memory is None:
            raise ValueError(f"preset {preset.name!r} sets no max_bytes: give device_memory (bytes)")
        limit = device_memory // 2
    elt = _elt(dtype)
    shapes = [(length, preset.batch) for length in preset.lengths] + [(length, 1) for length in preset.long_lengths]
    tasks = []
    for length, batch in shapes:
        tasks.append(Task("copy", "clone", FORWARD, length, batch))
        for path in OPERATION_PATHS["rope"]:
            tasks.append(Task("rope", path, FORWARD, length, batch, _static_skip(preset, "rope", path)))
        for scheme, paths in SCHEME_PATHS.items():
            for path in paths:
                for pass_ in PASSES:
                    skip = _static_skip(preset, scheme, path)
                    need = estimate_bytes(scheme, path, pass_, batch, preset.heads, length, preset.head_dim, elt)
                    if skip is None and need > limit:
                        skip = f"needs about {need / 2**30:.1f} GiB by estimate, over this run's limit of {limit / 2**30:.1f} GiB"
                    tasks.append(Task(scheme, path, pass_, length, batch, skip))
    return tasks


def _static_skip(preset: Preset, scheme: str, path: str) -> str | None:
    if path in FLEX_PATHS and not preset.compile_flex:
        return (
            f"compiled FlexAttention is left out of the {preset.name} preset: compiling it for the CPU takes tens of "
            "seconds per score_mod and shape (run with --compile-flex to include it)"
        )
    if path == "flex_eager" and not preset.flex_eager:
        return f"uncompiled FlexAttention materialises the (batch, heads, L, L) scores; the {preset.name} preset measures the compiled path 'flex'"
    if path == "posenc_compiled" and not preset.compile_rope:
        return f"torch.compile of apply_rope is left out of the {preset.name} preset"
    if path == "hf_eager" and not preset.hf_rope:
        return f"Hugging Face's apply_rotary_pos_emb is left out of the {preset.name} preset (importing transformers takes seconds)"
    return None


# --------------------------------------------------------------------------- timing and memory


def summarize(times_ms: list[float]) -> tuple[float, float, float]:
    """Median and the first and third quartiles (inclusive method) of repeated timings."""
    if len(times_ms) == 1:
        return times_ms[0], times_ms[0], times_ms[0]
    q25, median, q75 = statistics.quantiles(times_ms, n=4, method="inclusive")
    return median, q25, q75


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Milliseconds of `repeats` calls after `warmup` calls: CUDA events on a GPU, perf_counter elsewhere."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def measure_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of one call: CUDA's allocator on a GPU; elsewhere the tensors it creates (posenc.memory.peak_memory)."""
    if device.type == "cuda":
        return cuda_peak_memory(fn, device=device)
    return peak_memory(fn)


# --------------------------------------------------------------------------- the paths


def build_scheme(name: str, preset: Preset, method: str = "gather") -> Scheme:
    """The scheme measured under `name`, with learned tables drawn from a fixed seed (large enough to matter in checks)."""
    torch.manual_seed(0)
    if name == "nope":
        return NoPE()
    if name == "alibi":
        return ALiBi(preset.heads)
    if name == "t5":
        return T5Bias(preset.heads, preset.t5_buckets, preset.t5_max_distance, bidirectional=False, init_std=0.5)
    if name == "shaw":
        return ShawRelative(preset.head_dim, preset.shaw_max_distance, values=False, init_std=0.5)
    if name == "shaw_values":
        return ShawRelative(preset.head_dim, preset.shaw_max_distance, values=True, method=method, init_std=0.5)
    if name == "sliding_window":
        return SlidingWindow(preset.window)
    raise ValueError(f"no attention scheme is measured under {name!r}")


def causal_mask_mod(b, h, q_idx, kv_idx):
    """FlexAttention mask_mod of the causal mask: key index <= query index."""
    return kv_idx <= q_idx


def t5_inkernel_score_mod(scheme: T5Bias) -> Callable:
    """T5's bias as a score_mod that computes the bucket from kv_idx - q_idx inside the kernel (keys and queries at 0..L-1)."""
    table, buckets, distance, bidirectional = scheme.table, scheme.num_buckets, scheme.max_distance, scheme.bidirectional

    def t5_bias(score, b, h, q_idx, kv_idx):
        return score + table[t5_relative_bucket(kv_idx - q_idx, bidirectional, buckets, distance), h]

    return t5_bias


def rope_qk(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on queries and keys, as posenc.attention applies it (Rope.transform_qk on each)."""
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)


@contextlib.contextmanager
def _run_settings(preset: Preset) -> Iterator[None]:
    """Threads as the preset says, room for every compiled variant, and no warnings on the way."""
    threads = torch.get_num_threads()
    config = torch._dynamo.config
    limits = {name: 256 for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit") if hasattr(config, name)}
    saved = {name: getattr(config, name) for name in limits}
    try:
        if preset.threads is not None:
            torch.set_num_threads(preset.threads)
        for name, value in limits.items():
            setattr(config, name, max(value, saved[name]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # uncompiled flex and first compiles warn; the reasons are recorded instead
            yield
    finally:
        torch.set_num_threads(threads)
        for name, value in saved.items():
            setattr(config, name, value)


class Runner:
    """Runs tasks on one device: builds each path, checks it against its reference, times it, measures its memory."""

    def __init__(self, preset: Preset, device: torch.device, dtype: torch.dtype, log: Callable[[str], None] | None = None):
        self.preset, self.device, self.dtype, self.log = preset, device, dtype, log
        self.start = time.perf_counter()
        self.elt = _elt(dtype)
        self._inputs: dict = {}
        self._schemes: dict = {}
        self._references: dict = {}
        self._block_masks: dict = {}
        self._compiled: dict = {}
        self._hf = None
        self.first_call_s: dict[str, float] = {}
        self.block_fractions: dict[str, dict[str, float]] = {}
        self.baseline_backend = "default"
        self.baseline_note: str | None = None

    # ----------------------------------------------------------------- inputs and cached pieces

    def inputs(self, length: int, batch: int) -> tuple[torch.Tensor, ...]:
        """q, k, v and the output gradient for a shape, the same for every path (seeded by the shape)."""
        key = (length, batch)
        if key not in self._inputs:
            gen = torch.Generator().manual_seed(1000 + 7 * batch + length)
            shape = (batch, self.preset.heads, length, self.preset.head_dim)
            if len(self._inputs) >= 2:  # keep the inputs of two shapes: the one measured and the one checked
                self._inputs.pop(next(iter(self._inputs)))
            self._inputs[key] = tuple(torch.randn(shape, generator=gen).to(self.device, self.dtype) for _ in range(4))
        return self._inputs[key]

    def scheme(self, name: str, path: str) -> Scheme:
        method = "naive" if path == "explicit_naive" else "gather"
        key = (name, method)
        if key not in self._schemes:
            self._schemes[key] = build_scheme(name, self.preset, method).to(self.device)
        return self._schemes[key]

    def block_mask(self, scheme: str, length: int):
        from torch.nn.attention.flex_attention import create_block_mask

        kind = "sliding_window" if scheme == "sliding_window" else "causal"
        key = (kind, length)
        if key not in self._block_masks:
            mask_mod = window_mask_mod(self.preset.window) if kind == "sliding_window" else causal_mask_mod
            block_mask = create_block_mask(mask_mod, None, None, length, length, device=self.device.type)
            self._block_masks[key] = block_mask
            dense = block_mask.to_dense()
            self.block_fractions.setdefault(str(length), {})[kind] = round(float(dense.sum()) / dense.numel(), 6)
        return self._block_masks[key]

    def compiled(self, what: str) -> Callable:
        if what not in self._compiled:
            if what == "flex":
                from torch.nn.attention.flex_attention import flex_attention as fn
            else:
                fn = rope_qk
            self._compiled[what] = torch.compile(fn, backend=self.preset.compile_backend, dynamic=self.preset.compile_dynamic)
        return self._compiled[what]

    def hf_apply_rotary_pos_emb(self):
        if self._hf is None:
            try:
                from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
            except ImportError as exc:
                raise SkipPath(f"transformers is not installed here ({exc.__class__.__name__}: {exc})") from None
            self._hf = apply_rotary_pos_emb
        return self._hf

    def hf_cos_sin(self, length: int, batch: int, like: torch.Tensor, inv_freq: torch.Tensor):
        """cos and sin as Hugging Face's LlamaRotaryEmbedding makes them (once per forward, shared by the layers).

        It is given posenc's frequencies: Hugging Face forms them in float32 and posenc in
        float64 (rounded once), and with its own the rotated outputs differed from posenc's by
        about 1e-4 at 2,048 positions, which would blur the check of the rotation itself.
        """
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        p = self.preset
        config = LlamaConfig(hidden_size=p.heads * p.head_dim, num_attention_heads=p.heads, head_dim=p.head_dim, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        rotary = LlamaRotaryEmbedding(config).to(self.device)
        rotary.inv_freq = inv_freq.clone()
        positions = torch.arange(length, device=self.device)[None].expand(batch, -1)
        return rotary(like, positions)

    # ----------------------------------------------------------------- building a path

    def attention_fn(self, scheme_name: str, path: str, length: int) -> Callable:
        """fn(q, k, v) -> output of the path (batch, heads, L, head_dim)."""
        device = self.device
        if path == "sdpa_causal":
            return self._baseline
        scheme = self.scheme(scheme_name, path)
        if path in ("explicit", "explicit_naive", "explicit_gather"):
            return lambda q, k, v: attention(q, k, v, scheme, backend="explicit")
        if path == "flex_eager":
            return lambda q, k, v: attention(q, k, v, scheme, backend="flex")
        if path == "sdpa_mask":
            if scheme_name == "nope":  # plain causal: hand a mask over, so the mask is materialised rather than is_causal
                everything = torch.ones(length, length, dtype=torch.bool, device=device)
                return lambda q, k, v: attention(q, k, v, scheme, backend="sdpa", mask=everything)
            return lambda q, k, v: attention(q, k, v, scheme, backend="sdpa")
        if path in FLEX_PATHS:
            flex = self.compiled("flex")
            block_mask = self.block_mask(scheme_name, length)
            # two tensors, not one passed twice: a compiled score_mod whose query and key positions alias trips
            # torch.compile's aliasing guard when the length changes
            q_pos, k_pos = torch.arange(length, device=device), torch.arange(length, device=device)
            scale = 1.0 / math.sqrt(self.preset.head_dim)
            if path == "flex_inkernel":
                score_mod = t5_inkernel_score_mod(scheme)
                return lambda q, k, v: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
            return lambda q, k, v: flex(q, k, v, score_mod=scheme.score_mod(q_pos, k_pos, q), block_mask=block_mask, scale=scale)
        raise ValueError(f"unknown path {path!r}")

    def _baseline(self, q, k, v):
        if self.device.type == "cuda" and self.baseline_backend == "flash":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def _choose_baseline_backend(self, q, k, v) -> str:
        """On a GPU, the FlashAttention backend if it runs for these inputs; otherwise torch's default choice."""
        if self.device.type != "cuda":
            return ""
        self.baseline_backend = "flash"
        try:
            self._baseline(q[:, :, :128], k[:, :, :128], v[:, :, :128])
            return ""
        except RuntimeError as exc:
            self.baseline_backend = "default"
            return f"the FlashAttention backend cannot run here ({str(exc).splitlines()[0]}); torch's default SDPA backend was used"

    def step(self, task: Task, length: int) -> tuple[Callable[[], object], Callable[[], list[torch.Tensor]]]:
        """The measured call for a task at `length`, and a function returning what its check compares."""
        batch = task.batch
        q, k, v, grad_out = self.inputs(length, batch)
        if task.scheme == "copy":
            qk = torch.stack((q, k))
            return (lambda: qk.clone()), (lambda: [qk.clone()])
        if task.scheme == "rope":
            return self._rope_step(task.path, length, batch, q, k)
        fn = self.attention_fn(task.scheme, task.path, length)
        if task.pass_ == FORWARD:

            def forward():
                with torch.no_grad():
                    return fn(q, k, v)

            return forward, lambda: [forward()]
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        params = [] if task.path == "sdpa_causal" else [p for p in self.scheme(task.scheme, task.path).parameters() if p.requires_grad]

        def forward_backward():
            for t in leaves + params:
                t.grad = None
            out = fn(*leaves)
            out.backward(grad_out)
            return out

        def results():
            out = forward_backward()
            return [out.detach()] + [t.grad for t in leaves + params]

        return forward_backward, results

    def _rope_step(self, path, length, batch, q, k):
        positions = torch.arange(length, device=self.device)
        inv_freq = rope_frequencies(self.preset.head_dim)[0].to(self.device)
        if path == "posenc":
            fn = lambda: rope_qk(q, k, positions, inv_freq)  # noqa: E731
        elif path == "posenc_compiled":
            compiled = self.compiled("rope")
            fn = lambda: compiled(q, k, positions, inv_freq)  # noqa: E731
        elif path == "hf_eager":
            apply_rotary_pos_emb = self.hf_apply_rotary_pos_emb()
            cos, sin = self.hf_cos_sin(length, batch, q, inv_freq)
            fn = lambda: apply_rotary_pos_emb(q, k, cos, sin)  # noqa: E731
        else:
            raise ValueError(f"unknown RoPE path {path!r}")
        return fn, lambda: list(fn())

    # ----------------------------------------------------------------- checks

    def reference(self, task: Task, length: int) -> list[torch.Tensor]:
        ref_path = REFERENCE.get(task.scheme, "explicit")
        key = (task.scheme, ref_path, task.pass_, length, task.batch)
        if key not in self._references:
            self._references = {k: v for k, v in self._references.items() if k[3:] == (length, task.batch)}  # keep one shape
            _, results = self.step(dataclasses.replace(task, path=ref_path), length)
            self._references[key] = [t.detach().clone() for t in results()]
        return self._references[key]

    def check_length(self, task: Task, fits: Callable[[int], bool]) -> int:
        """The task's length if its reference fits in memory there, else the longest planned length below it that does."""
        p = self.preset
        candidates = sorted({*p.lengths, *p.long_lengths}, reverse=True)
        for length in candidates:
            if length <= task.seq_len and fits(length):
                return length
        raise SkipPath(f"no planned length up to {task.seq_len} at which the reference path fits in memory for the check")

    def check(self, task: Task, fits: Callable[[int], bool]) -> tuple[float, int]:
        """Compare the path with its reference (outputs, and gradients backward); returns (max abs error, length checked)."""
        length = self.check_length(task, fits) if task.scheme not in ("copy", "rope") else task.seq_len
        reference = self.reference(task, length)
        _, results = self.step(task, length)
        t0 = time.perf_counter()
        got = results()
        self.first_call_s[f"{task.scheme}/{task.path}/{task.pass_}/{length}"] = round(time.perf_counter() - t0, 3)
        if len(got) != len(reference):
            raise SkipPath(f"check failed: {len(got)} results against {len(reference)} from the reference")
        tol = TOLERANCE[self.dtype]
        error = 0.0
        for g, r in zip(got, reference):
            if g is None:
                raise SkipPath("check failed: the path gives no gradient where the reference does")
            g, r = g.float(), r.float()
            error = max(error, float((g - r).abs().max()))
            if task.scheme == "copy":
                agrees = torch.equal(g, r)
            elif self.dtype == torch.float32:
                agrees = bool(torch.isclose(g, r, atol=tol, rtol=tol).all())
            else:
                agrees = float(torch.linalg.vector_norm(g - r)) <= tol * float(torch.linalg.vector_norm(r))
            if not agrees:
                raise SkipPath(f"check failed: differs from the reference by up to {error:.3g} (tolerance {tol:g})")
        return error, length

    # ----------------------------------------------------------------- one task

    def execute(self, task: Task, fits: Callable[[Task, int], bool]) -> dict:
        p = self.preset
        elt = self.elt
        row = {
            "preset": p.name, "scheme": task.scheme, "path": task.path, "pass": task.pass_, "seq_len": task.seq_len,
            "batch": task.batch, "heads": p.heads, "head_dim": p.head_dim, "dtype": str(self.dtype).removeprefix("torch."),
            "median_ms": None, "q25_ms": None, "q75_ms": None, "peak_mem_bytes": None, "status": "skipped", "reason": "",
            "flops": None, "bytes_moved": None, "check_seq_len": None, "max_abs_err": None, "repeats": None,
        }  # fmt: skip
        n = task.batch * p.heads * task.seq_len * p.head_dim
        if task.scheme in ("copy", "rope"):
            row["bytes_moved"] = 4 * n * elt  # read q and k, write two tensors of their size
            row["flops"] = 6 * n if task.scheme == "rope" else 0  # two products and a sum per element
        else:
            row["flops"] = nominal_flops(task.pass_, task.batch, p.heads, task.seq_len, p.head_dim)
            row["bytes_moved"] = minimal_bytes(task.pass_, task.batch, p.heads, task.seq_len, p.head_dim, elt)
        if task.skip:
            row["reason"] = task.skip
            return self._logged(row)
        if time.perf_counter() - self.start > p.time_budget_s:
            row["reason"] = f"the preset's time budget of {p.time_budget_s:.0f} s was used up before this measurement"
            return self._logged(row)
        notes = []
        try:
            if task.path == "sdpa_causal" and self.baseline_note is None:
                self.baseline_note = self._choose_baseline_backend(*self.inputs(min(p.lengths), task.batch)[:3])
            if task.path == "sdpa_causal" and self.baseline_note:
                notes.append(self.baseline_note)
            error, check_len = self.check(task, lambda length: fits(task, length))
            fn, _ = self.step(task, task.seq_len)
            times = time_call(fn, self.device, p.warmup, p.repeats)
            if self.device.type != "cuda" and task.path in (*FLEX_PATHS, "flex_eager"):
                # a TorchDispatchMode cannot enter FlexAttention's higher-order operator, and a failed attempt
                # leaves torch.compile refusing FlexAttention for the rest of the process
                notes.append("peak memory not measured: posenc.peak_memory cannot look inside FlexAttention (a higher-order operator)")
            else:
                try:
                    row["peak_mem_bytes"] = measure_memory(fn, self.device)
                except Exception as exc:  # noqa: BLE001 - a path whose memory this counter cannot see
                    notes.append(f"peak memory not measured ({type(exc).__name__}: {_first_line(exc)})")
            row["median_ms"], row["q25_ms"], row["q75_ms"] = summarize(times)
            row.update(status="ok", check_seq_len=check_len, max_abs_err=error, repeats=p.repeats)
        except SkipPath as exc:
            notes.append(str(exc))
        except torch.OutOfMemoryError:
            notes.append("out of memory")
        except Exception as exc:  # noqa: BLE001 - a path this device or torch cannot run: record why
            notes.append(f"{type(exc).__name__}: {_first_line(exc)}")
        finally:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        row["reason"] = "; ".join(notes)
        return self._logged(row)

    def _logged(self, row: dict) -> dict:
        if self.log is not None:
            timing = f"{row['median_ms']:10.3f} ms" if row["status"] == "ok" else f"skipped: {row['reason'][:70]}"
            self.log(f"{row['scheme']:>14} {row['path']:<16} {row['pass']:<17} L={row['seq_len']:<6} B={row['batch']:<2} {timing}")
        return row


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# --------------------------------------------------------------------------- metadata


def cuda_info(device: torch.device) -> dict:
    """Name, capability, memory, CUDA runtime and driver of a GPU; the same keys, all None, elsewhere."""
    info = {"name": None, "capability": None, "total_memory_bytes": None, "cuda_runtime": torch.version.cuda, "cuda_driver": None, "cudnn": None}
    if device.type != "cuda" or not torch.cuda.is_available():
        return info
    props = torch.cuda.get_device_properties(device)
    info.update(name=props.name, capability=".".join(map(str, torch.cuda.get_device_capability(device))), total_memory_bytes=props.total_memory)
    info["cudnn"] = torch.backends.cudnn.version()
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["cuda_driver"] = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def collect_metadata(preset: str | Preset, device: torch.device, dtype: torch.dtype) -> dict:
    """Everything a reader needs to place the numbers: device, versions, commit, date, threads, platform, the preset."""
    preset = get_preset(preset)
    try:
        from importlib.metadata import version

        transformers_version = version("transformers")
    except Exception:  # noqa: BLE001 - not installed
        transformers_version = None
    from . import __version__

    gpu = cuda_info(device)
    commit, dirty = git_state(".")  # uncommitted changes to the package code, not to results being written
    return {
        "preset": preset.name,
        "config": json.loads(json.dumps(dataclasses.asdict(preset))),
        "device": {
            "type": device.type,
            "name": gpu["name"] if device.type == "cuda" else cpu_model(),
            "capability": gpu["capability"] if device.type == "cuda" else torch.backends.cpu.get_cpu_capability(),
            "total_memory_bytes": gpu["total_memory_bytes"],
        },
        "dtype": str(dtype).removeprefix("torch."),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda_runtime": gpu["cuda_runtime"],
            "cuda_driver": gpu["cuda_driver"],
            "cudnn": gpu["cudnn"],
            "transformers": transformers_version,
            "posenc": __version__,
        },
        "git": {"commit": commit, "dirty": dirty},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_start": load_average(),
        "timer": "CUDA events" if device.type == "cuda" else "time.perf_counter",
        "memory": "torch.cuda.max_memory_allocated above the bytes allocated before the call (posenc.memory.cuda_peak_memory)"
        if device.type == "cuda"
        else "bytes of the tensors a call creates, at most, counted operator by operator (posenc.memory.peak_memory); scratch memory inside one kernel is not seen",
        "tolerance": TOLERANCE[dtype],
        "columns": list(COLUMNS),
        "baseline": {"scheme": BASELINE[0], "path": BASELINE[1]},
    }


# --------------------------------------------------------------------------- running and files


def run(
    preset: str | Preset,
    out: str | Path | None = None,
    *,
    schemes: tuple[str, ...] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[dict], dict]:
    """Run every measurement of a preset; returns (rows, metadata), and writes them under `out` if given.

    `schemes` keeps only the measurements of those schemes (e.g. ("nope", "alibi"),
    or "rope" and "copy"); the baseline is always measured.
    """
    preset = get_preset(preset)
    device = resolve_device(preset)
    dtype = choose_dtype(device)
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    tasks = plan(preset, memory, dtype)
    if schemes is not None:
        unknown = sorted(set(schemes) - set(ALL_SCHEMES))
        if unknown:
            raise ValueError(f"unknown schemes {unknown}; the benchmark measures {', '.join(ALL_SCHEMES)}")
        keep = set(schemes) | {BASELINE[0]}
        tasks = [t for t in tasks if t.scheme in keep and (t.scheme != BASELINE[0] or BASELINE[0] in schemes or t.path == BASELINE[1])]
    limit = preset.max_bytes if preset.max_bytes is not None else memory // 2
    elt = _elt(dtype)

    def fits(task: Task, length: int) -> bool:
        ref = REFERENCE.get(task.scheme, "explicit")
        return estimate_bytes(task.scheme, ref, task.pass_, task.batch, preset.heads, length, preset.head_dim, elt) <= limit

    with _run_settings(preset):
        meta = collect_metadata(preset, device, dtype)
        runner = Runner(preset, device, dtype, log)
        rows = [runner.execute(task, fits) for task in tasks]
        for length in sorted({*preset.lengths, *preset.long_lengths}):
            for scheme in ("nope", "sliding_window"):
                runner.block_mask(scheme, length)  # fractions of blocks computed, for the sliding-window goal
        rows.append(_matmul_row(preset, device, dtype, log))
    meta.update(
        elapsed_s=round(time.perf_counter() - runner.start, 1),
        load_average_end=load_average(),
        baseline_backend=runner.baseline_backend if device.type == "cuda" else "torch's default CPU kernel",
        block_size=128,
        block_fractions=runner.block_fractions,
        first_call_s=runner.first_call_s,
        schemes=None if schemes is None else sorted(set(schemes)),
    )
    meta = json.loads(json.dumps(meta))  # as the file holds it: lists, not tuples
    if out is not None:
        write_results(rows, meta, out)
    return rows, meta


def _matmul_row(preset: Preset, device: torch.device, dtype: torch.dtype, log) -> dict:
    """A square matrix product, the device's compute reference (FLOP/s) for the roofline."""
    n = preset.matmul_size
    gen = torch.Generator().manual_seed(n)
    a, b = (torch.randn(n, n, generator=gen).to(device, dtype) for _ in range(2))
    times = time_call(lambda: a @ b, device, max(preset.warmup, 1), preset.repeats)
    median, q25, q75 = summarize(times)
    row = {
        "preset": preset.name, "scheme": "matmul", "path": "mm", "pass": FORWARD, "seq_len": n, "batch": 1, "heads": 1,
        "head_dim": n, "dtype": str(dtype).removeprefix("torch."), "median_ms": median, "q25_ms": q25, "q75_ms": q75,
        "peak_mem_bytes": None, "status": "ok", "reason": "", "flops": 2 * n**3, "bytes_moved": 3 * n * n * _elt(dtype),
        "check_seq_len": None, "max_abs_err": None, "repeats": preset.repeats,
    }  # fmt: skip
    if log is not None:
        log(f"{'matmul':>14} {'mm':<16} {FORWARD:<17} n={n:<6}      {median:10.3f} ms")
    return row


def result_paths(out: str | Path, preset: str) -> tuple[Path, Path]:
    out = Path(out)
    return out / f"benchmark_{preset}.csv", out / f"benchmark_{preset}.json"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_results(rows: list[dict], meta: dict, out: str | Path) -> tuple[Path, Path]:
    """The tidy CSV (one row per measurement) and the JSON metadata, as benchmark_<preset>.csv/.json under `out`."""
    csv_path, json_path = result_paths(out, meta["preset"])
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([_cell(row[c]) for c in COLUMNS])
    json_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return csv_path, json_path


def read_metadata(out: str | Path, preset: str) -> dict | None:
    """The metadata of a stored run, or None where that preset has not been run yet."""
    _, json_path = result_paths(out, preset)
    return json.loads(json_path.read_text()) if json_path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", default="chapters/results", help="folder for benchmark_<preset>.csv and .json (default: %(default)s)")
    parser.add_argument("--compile-flex", action="store_true", help="also measure compiled FlexAttention where the preset leaves it out")
    parser.add_argument("--schemes", nargs="+", choices=ALL_SCHEMES, help="measure only these schemes (the baseline is always measured)")
    parser.add_argument("--quiet", action="store_true", help="do not print one line per measurement")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.compile_flex:
        preset = dataclasses.replace(preset, compile_flex=True)
    try:
        schemes = None if args.schemes is None else tuple(args.schemes)
        rows, meta = run(preset, args.out, schemes=schemes, log=None if args.quiet else lambda line: print(line, flush=True))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    csv_path, json_path = result_paths(args.out, preset.name)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok} measurements, {len(rows) - ok} skipped, in {meta['elapsed_s']} s: {csv_path} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
