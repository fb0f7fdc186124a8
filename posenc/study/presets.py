"""What a benchmark run measures: presets and the plan of measurements.

A `Preset` names the device, the shapes, the repeats and the paths; `plan` lists every
measurement in the order it runs, each with the reason it will be skipped (or None).
posenc.study.bench_budget turns a plan into an estimate of the run's time.
"""

from __future__ import annotations

import dataclasses

import torch

from .bench_paths import FORWARD, PASSES

BASELINE = (
    "nope",
    "sdpa_causal",
)  # plain causal attention through posenc.attention (SDPA)
# SDPA forced onto one fused backend (torch.nn.attention.sdpa_kernel), each a row on a
# GPU: the
# baseline of a shape and pass there is the fastest of them and sdpa_causal (SDPA's own
# choice)
SDPA_BACKEND_PATHS = {
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
}
BASELINE_PATHS = (BASELINE[1], *SDPA_BACKEND_PATHS)
SCHEME_PATHS: dict[str, tuple[str, ...]] = {
    # nope/flex: plain causal FlexAttention; flex_direct: the same compiled kernel
    # called
    # directly (posenc's score_mod and block mask, no posenc.attention), its host
    # overhead's measure
    "nope": (
        *BASELINE_PATHS,
        "flex",
        "flex_direct",
        "explicit",
        "sdpa",
        "flex_uncompiled",
    ),
    "alibi": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "t5": ("flex", "flex_direct", "explicit", "sdpa", "flex_uncompiled"),
    # T5's former score_mod, the bucket computed from the distance for every score
    # (forward)
    "t5_computed": ("flex",),
    "shaw": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "sliding_window": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "shaw_values": ("explicit_naive", "explicit_gather"),
}
OPERATION_PATHS = {
    # a copy of RoPE's bytes into a buffer made once (the bandwidth reference), and a
    # clone,
    # which allocates its output on every call as RoPE does
    "copy": ("preallocated", "clone"),
    "rope": ("posenc", "posenc_compiled", "hf_eager"),
}  # outside the kernel, forward only, timed in a group of their own
OPERATION_BASELINE = ("copy", "preallocated")
ALL_SCHEMES = (*SCHEME_PATHS, *OPERATION_PATHS)
ALL_PATHS = tuple(
    sorted(
        {
            p
            for paths in (*SCHEME_PATHS.values(), *OPERATION_PATHS.values())
            for p in paths
        }
    )
)


def _positive_ints(name: str, values, allow_empty: bool = False) -> None:
    if not isinstance(values, tuple) or (not values and not allow_empty):
        raise TypeError(
            f"{name} must be a {'' if allow_empty else 'non-empty '}tuple of positive "
            f"ints; got {values!r}"
        )
    if any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values):
        raise ValueError(f"{name} must hold positive ints; got {values!r}")


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
    # rounds: every path of a shape is timed once per round, the baseline among them
    repeats: int = 11
    threads: int | None = (
        None  # torch.set_num_threads for the run; None leaves it as it is
    )
    window: int = 256  # sliding window: keys each query sees, itself included
    shaw_max_distance: int = 16
    t5_buckets: int = 32
    t5_max_distance: int = 128
    matmul_size: int = 1024
    schemes: tuple[str, ...] = ALL_SCHEMES
    paths: tuple[str, ...] | None = (
        None  # only these paths (and the baseline); None: all
    )
    passes: tuple[str, ...] = PASSES
    rope_dtypes: tuple[
        str, ...
    ] = ()  # dtypes RoPE is also measured in, besides the run's
    compile_flex: bool = True
    # uncompiled FlexAttention materialises the scores: worth measuring on a CPU only
    flex_uncompiled: bool = True
    compile_backend: str = "inductor"
    hf_rope: bool = True
    # estimated peak above which a path is skipped; None: half the GPU's memory
    max_bytes: int | None = None
    time_budget_s: float | None = (
        600.0  # None: computed by `budget` (its estimate times `BUDGET_MARGIN`)
    )
    # GPU: bytes written between timed calls; None: twice the device's L2 cache
    l2_flush_bytes: int | None = None
    goal_length: int = (
        4096  # the time goals are judged from this length on (posenc.study.goals)
    )
    # where set, the batch at each length is tokens // L (at least 1), so that every
    # call
    # does about the same work and lasts long enough to time (long_lengths keep batch 1)
    tokens: int | None = None
    min_calls: int = (
        1  # calls per timed sample, at least (a GPU: >= 2, the first is dropped)
    )
    min_sample_ms: float = 0.0  # calls per sample: enough for about this many ms
    op_repeats: int | None = None  # rounds of the copy and RoPE group; None: `repeats`
    op_sample_ms: float = 0.0  # the copy and RoPE group's min_sample_ms
    # glibc's allocator held in a steady state for the run
    # (posenc.study.measure.steady_allocator)
    steady_allocator: bool = False
    description: str = ""

    def batch_at(self, length: int) -> int:
        """The batch measured at `length` (a long length: 1)."""
        if length in self.long_lengths and length not in self.lengths:
            return 1
        return self.batch if self.tokens is None else max(1, self.tokens // length)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty str; got {self.name!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda'; got {self.device!r}")
        _positive_ints("lengths", self.lengths)
        _positive_ints("long_lengths", self.long_lengths, allow_empty=True)
        _positive_ints(
            "batch, heads, head_dim, window, matmul_size, goal_length",
            (
                self.batch,
                self.heads,
                self.head_dim,
                self.window,
                self.matmul_size,
                self.goal_length,
            ),
        )
        if (
            not isinstance(self.warmup, int)
            or self.warmup < 0
            or not isinstance(self.repeats, int)
            or self.repeats < 1
        ):
            raise ValueError(
                "warmup must be an int >= 0 and repeats an int >= 1; got "
                f"{self.warmup!r} and {self.repeats!r}"
            )
        if self.threads is not None and (
            not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(
                f"threads must be None or a positive int; got {self.threads!r}"
            )
        for field, allowed in (
            ("schemes", ALL_SCHEMES),
            ("paths", ALL_PATHS),
            ("passes", PASSES),
        ):
            values = getattr(self, field)
            if values is None and field == "paths":
                continue
            if not isinstance(values, tuple):
                raise TypeError(f"{field} must be a tuple; got {values!r}")
            unknown = sorted(set(values) - set(allowed))
            if unknown:
                raise ValueError(
                    f"unknown {field} {unknown}; choose from {', '.join(allowed)}"
                )
        for dt in self.rope_dtypes:
            if not isinstance(getattr(torch, dt, None), torch.dtype):
                raise ValueError(
                    "rope_dtypes must name torch dtypes ('bfloat16', 'float16'); got "
                    f"{dt!r}"
                )
        for field in ("max_bytes", "l2_flush_bytes"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(
                    f"{field} must be None or a positive int of bytes; got {value!r}"
                )
        if self.tokens is not None:
            _positive_ints("tokens", (self.tokens,))
        _positive_ints("min_calls", (self.min_calls,))
        if self.op_repeats is not None:
            _positive_ints("op_repeats", (self.op_repeats,))
        if not (self.min_sample_ms >= 0 and self.op_sample_ms >= 0):
            raise ValueError(
                "min_sample_ms and op_sample_ms must be >= 0; got "
                f"{self.min_sample_ms!r} and {self.op_sample_ms!r}"
            )
        if self.time_budget_s is not None and not self.time_budget_s >= 0:
            raise ValueError(
                f"time_budget_s must be None or >= 0; got {self.time_budget_s!r}"
            )


_COLAB_PATHS = (
    *BASELINE_PATHS,
    "flex",
    "flex_direct",
    "sdpa",
    *OPERATION_PATHS["copy"],
    *OPERATION_PATHS["rope"],
)
_KERNEL_SCHEMES = (
    "nope",
    "alibi",
    "t5",
    "t5_computed",
    "sliding_window",
    "copy",
    "rope",
)
PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu",
        "cpu",
        (256, 512, 1024, 2048),
        batch=1,
        heads=4,
        head_dim=64,
        threads=1,
        compile_flex=False,
        max_bytes=3 * 2**30,
        op_repeats=31,
        op_sample_ms=20.0,
        steady_allocator=True,
        description="Every path but compiled flex, L up to 2048, one CPU thread "
        "(torch.set_num_threads(1)), float32.",
    ),
    "kernel": Preset(
        "kernel",
        "cpu",
        (4096,),
        batch=1,
        heads=8,
        head_dim=64,
        threads=1,
        window=256,
        passes=(FORWARD,),
        schemes=_KERNEL_SCHEMES,
        paths=(
            "sdpa_causal",
            "flex",
            "flex_direct",
            *OPERATION_PATHS["copy"],
            *OPERATION_PATHS["rope"],
        ),
        rope_dtypes=("bfloat16",),
        max_bytes=4 * 2**30,
        op_repeats=31,
        op_sample_ms=20.0,
        steady_allocator=True,
        description="The fast paths at L = 4096 (B=1, H=8, d=64), one CPU thread, "
        "forward (FlexAttention has no backward on the CPU): compiled FlexAttention "
        "through posenc.attention and called directly, T5's score_mod beside its "
        "former one, RoPE in float32 and bfloat16 beside copies of its bytes; the "
        "goals of posenc's kernels.",
    ),
    "colab": Preset(
        "colab",
        "cuda",
        (8192, 4096),
        batch=1,
        tokens=65536,
        heads=16,
        head_dim=64,
        warmup=2,
        repeats=11,
        min_calls=3,
        min_sample_ms=3.0,
        op_sample_ms=3.0,
        window=1024,
        matmul_size=8192,
        schemes=_KERNEL_SCHEMES,
        paths=_COLAB_PATHS,
        flex_uncompiled=False,
        time_budget_s=None,
        description="One GPU, the goals' paths: 8k then 4k tokens, 64k tokens per call "
        "(batch 8 and 16), both passes; every fused SDPA backend, compiled flex for "
        "plain "
        "causal, ALiBi, T5 and the window through posenc.attention (and called "
        "directly), "
        "their SDPA paths with the kept masks, RoPE against a copy of its bytes. Sized "
        "for "
        "an L4, A100 or H100 in bfloat16; a T4 runs float16 with smaller flex blocks.",
    ),
    "gpu": Preset(
        "gpu",
        "cuda",
        (4096, 8192, 16384, 512, 1024, 2048),
        batch=4,
        tokens=65536,
        heads=16,
        head_dim=64,
        long_lengths=(32768,),
        warmup=2,
        repeats=11,
        min_calls=3,
        min_sample_ms=3.0,
        op_sample_ms=3.0,
        window=1024,
        matmul_size=8192,
        flex_uncompiled=False,
        time_budget_s=None,
        description="One GPU, bf16 where supported (fp16 otherwise); the lengths the "
        "goals need (4k and up) first, 64k tokens per call; 32k at batch 1.",
    ),
    "tiny": Preset(
        "tiny",
        "cpu",
        (64, 128),
        batch=1,
        heads=2,
        head_dim=16,
        warmup=0,
        repeats=3,
        threads=1,
        window=16,
        shaw_max_distance=4,
        t5_buckets=8,
        t5_max_distance=32,
        matmul_size=64,
        hf_rope=False,
        compile_flex=False,
        compile_backend="aot_eager",
        max_bytes=2**28,
        time_budget_s=120.0,
        rope_dtypes=("bfloat16",),
        description="Seconds on a CPU, for tests and the chapter's live run: every "
        "path at tiny shapes; RoPE compiled with the aot_eager backend (traced, no "
        "code generated).",
    ),
}


def get_preset(preset: str | Preset) -> Preset:
    if isinstance(preset, Preset):
        return preset
    if not isinstance(preset, str):
        raise TypeError(
            f"preset must be a Preset or the name of one; got {type(preset).__name__}"
        )
    if preset not in PRESETS:
        raise ValueError(
            f"preset must be one of {', '.join(repr(p) for p in PRESETS)}; got "
            f"{preset!r}"
        )
    return PRESETS[preset]
