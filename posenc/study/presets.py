"""What a benchmark run measures: presets, the plan of measurements, and the time a plan will take.

A `Preset` names the device, the shapes, the repeats and the paths; `plan` lists every
measurement in the order it runs, each with the reason it will be skipped (or None);
`budget` counts the compiles and calls of a plan and turns them into an estimate of the
run's time under a stated `CostModel` (per-compile seconds, achieved FLOP/s and bandwidth,
per-call overhead): the GPU presets' time budgets are computed from it, not guessed.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import torch

from .bench_paths import BACKWARD, COMPILED, FORWARD, PASSES

BASELINE = ("nope", "sdpa_causal")  # (scheme, path) every ratio is taken against
SCHEME_PATHS: dict[str, tuple[str, ...]] = {
    "nope": (
        "sdpa_causal",
        "flex",
        "explicit",
        "sdpa",
        "flex_uncompiled",
    ),  # nope/flex: plain causal FlexAttention
    "alibi": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "t5": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "shaw": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "sliding_window": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "shaw_values": ("explicit_naive", "explicit_gather"),
}
OPERATION_PATHS = {
    "copy": ("clone",),
    "rope": ("posenc", "posenc_compiled", "hf_eager"),
}  # outside the kernel, forward only
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
            f"{name} must be a {'' if allow_empty else 'non-empty '}tuple of positive ints; got {values!r}"
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
    repeats: int = 11  # rounds: every path of a shape is timed once per round, the baseline among them
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
    flex_uncompiled: bool = True  # uncompiled FlexAttention materialises the scores: worth measuring on a CPU only
    compile_backend: str = "inductor"
    hf_rope: bool = True
    max_bytes: int | None = (
        None  # estimated peak above which a path is skipped; None: half the GPU's memory
    )
    time_budget_s: float | None = (
        600.0  # None: computed by `budget` (its estimate times `BUDGET_MARGIN`)
    )
    l2_flush_bytes: int | None = (
        None  # GPU: bytes written between timed calls; None: twice the device's L2 cache
    )
    goal_length: int = (
        4096  # the time goals are judged from this length on (posenc.study.goals)
    )
    description: str = ""

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
                f"warmup must be an int >= 0 and repeats an int >= 1; got {self.warmup!r} and {self.repeats!r}"
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
                    f"rope_dtypes must name torch dtypes ('bfloat16', 'float16'); got {dt!r}"
                )
        for field in ("max_bytes", "l2_flush_bytes"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(
                    f"{field} must be None or a positive int of bytes; got {value!r}"
                )
        if self.time_budget_s is not None and not self.time_budget_s >= 0:
            raise ValueError(
                f"time_budget_s must be None or >= 0; got {self.time_budget_s!r}"
            )


_COLAB_PATHS = (
    "sdpa_causal",
    "flex",
    "sdpa",
    "clone",
    "posenc",
    "posenc_compiled",
    "hf_eager",
)
PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu", "cpu", (256, 512, 1024, 2048), batch=1, heads=4, head_dim=64, threads=1, compile_flex=False, max_bytes=3 * 2**30,
        description="Every path but compiled flex, L up to 2048, one CPU thread (torch.set_num_threads(1)), float32.",
    ),
    "kernel": Preset(
        "kernel", "cpu", (4096,), batch=1, heads=8, head_dim=64, threads=1, window=256, passes=(FORWARD,),
        schemes=("nope", "alibi", "t5", "sliding_window", "copy", "rope"), paths=("sdpa_causal", "flex", "clone", "posenc", "posenc_compiled", "hf_eager"),
        rope_dtypes=("bfloat16",), max_bytes=4 * 2**30, description="The fast paths at L = 4096 (B=1, H=8, d=64), one CPU thread, "
        "forward (FlexAttention has no backward on the CPU); RoPE in float32 and bfloat16 next to a copy of its bytes; the goals of posenc's kernel work.",
    ),
    "colab": Preset(
        "colab", "cuda", (4096, 8192), batch=1, heads=16, head_dim=64, warmup=3, repeats=11, window=1024, matmul_size=4096,
        schemes=("nope", "alibi", "t5", "sliding_window", "copy", "rope"), paths=_COLAB_PATHS, flex_uncompiled=False, time_budget_s=None,
        description="Colab's GPU (a T4 in float16, an L4/A100/H100 in bfloat16): the goals' paths at 4k and 8k tokens, both passes; "
        "compiled flex for plain causal, ALiBi, T5 and the window, their SDPA paths with the kept masks, RoPE against a copy.",
    ),
    "gpu": Preset(
        "gpu", "cuda", (4096, 8192, 16384, 512, 1024, 2048), batch=4, heads=16, head_dim=64, long_lengths=(32768,), warmup=3, repeats=11,
        window=1024, matmul_size=8192, flex_uncompiled=False, time_budget_s=None,
        description="One GPU, bf16 where supported (fp16 otherwise); the lengths the goals need (4k and up) first; 32k at batch 1.",
    ),
    "tiny": Preset(
        "tiny", "cpu", (64, 128), batch=1, heads=2, head_dim=16, warmup=0, repeats=3, threads=1, window=16, shaw_max_distance=4,
        t5_buckets=8, t5_max_distance=32, matmul_size=64, hf_rope=False, compile_flex=False, compile_backend="aot_eager", max_bytes=2**28,
        time_budget_s=120.0, rope_dtypes=("bfloat16",), description="Seconds on a CPU, for tests and the chapter's live run: "
        "every path at tiny shapes; RoPE compiled with the aot_eager backend (traced, no code generated).",
    ),
}  # fmt: skip


TINY_ENV = "POSENC_TINY"  # set (to anything but "" or "0"): preset_here gives the tiny variant (the tests, the emulated device)


def tiny(preset: str | Preset) -> Preset:
    """`preset` at tiny shapes: the same device, schemes, paths, passes and steps, in seconds on a CPU or an emulated GPU.

    Its name gains "_tiny" (its results never overwrite the real preset's), Hugging Face's RoPE is left out
    (importing transformers takes seconds), and its goals are judged from its first length. Its timings mean nothing.
    """
    preset = get_preset(preset)
    base = preset.name.removesuffix("_tiny")
    return dataclasses.replace(
        preset, name=f"{base}_tiny", lengths=(64, 128), long_lengths=(), batch=1, heads=2, head_dim=16,
        window=16, shaw_max_distance=4, t5_buckets=8, t5_max_distance=32, warmup=1, repeats=3, matmul_size=64,
        l2_flush_bytes=2**16 if preset.device == "cuda" else None, hf_rope=False, max_bytes=2**28, time_budget_s=300.0, goal_length=64,
        description=f"{base} at tiny shapes (L = 64 and 128, 2 heads of width 16), for tests: its timings mean nothing.",
    )  # fmt: skip


def preset_here(name: str | Preset) -> Preset:
    """The preset to run here: `name`'s, or its tiny variant where $POSENC_TINY is set (the tests set it on the emulated GPU)."""
    preset = get_preset(name)
    return tiny(preset) if os.environ.get(TINY_ENV, "") not in ("", "0") else preset


@dataclasses.dataclass(frozen=True)
class Task:
    """One measurement: a scheme's path, a pass, a shape, a dtype (None: the run's); `skip` says why it will not run."""

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


def get_preset(preset: str | Preset) -> Preset:
    if isinstance(preset, Preset):
        return preset
    if not isinstance(preset, str):
        raise TypeError(
            f"preset must be a Preset or the name of one; got {type(preset).__name__}"
        )
    if preset not in PRESETS:
        raise ValueError(
            f"preset must be one of {', '.join(repr(p) for p in PRESETS)}; got {preset!r}"
        )
    return PRESETS[preset]


def choose_dtype(
    device: torch.device, bf16_supported: bool | None = None
) -> torch.dtype:
    """float32 on the CPU; on a GPU bfloat16 where the hardware supports it natively, float16 otherwise (a T4, say)."""
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
    """FLOPs of causal attention: 2 L^2 d per head forward (half of QK^T and PV), 3.5 times that forward+backward."""
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
    """A deliberately generous estimate of a path's peak memory, to skip what cannot fit before trying it."""
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


def _static_skip(preset: Preset, path: str) -> str | None:
    if path == "flex" and not preset.compile_flex:
        return f"compiled FlexAttention is left out of the {preset.name} preset (10-20 s of compiling per scheme and shape on a CPU; run with --compile-flex, or see the kernel preset)"
    if path == "flex_uncompiled" and not preset.flex_uncompiled:
        return f"uncompiled FlexAttention materialises the (batch, heads, L, L) scores; the {preset.name} preset measures the compiled path 'flex'"
    if path == "hf_eager" and not preset.hf_rope:
        return f"Hugging Face's apply_rotary_pos_emb is left out of the {preset.name} preset (importing transformers takes seconds)"
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
    """Every measurement of a preset, in the order it runs, each with the reason it will be skipped (or None)."""
    preset = get_preset(preset)
    limit = memory_limit(preset, device_memory)
    wanted = lambda scheme, path: (
        scheme in preset.schemes
        and (preset.paths is None or path in preset.paths or (scheme, path) == BASELINE)
    )  # noqa: E731
    tasks = []
    for length, batch in [(n, preset.batch) for n in preset.lengths] + [
        (n, 1) for n in preset.long_lengths
    ]:
        if wanted("copy", "clone"):
            tasks.append(Task("copy", "clone", FORWARD, length, batch))
        for dt in (None, *(getattr(torch, name) for name in preset.rope_dtypes)):
            tasks += [
                Task(
                    "rope", path, FORWARD, length, batch, _static_skip(preset, path), dt
                )
                for path in OPERATION_PATHS["rope"]
                if wanted("rope", path)
            ]
        for scheme, paths in SCHEME_PATHS.items():
            for path in (p for p in paths if wanted(scheme, p)):
                for pass_ in preset.passes:
                    skip = _static_skip(preset, path)
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
                        skip = f"needs about {need / 2**30:.1f} GiB by estimate, over this run's limit of {limit / 2**30:.1f} GiB"
                    tasks.append(Task(scheme, path, pass_, length, batch, skip))
    return tasks


# ----------------------------------------------------------------------------------------------- the time a plan takes


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Assumptions behind a time estimate; each is stated, none measured here. Correct them from a run's first_call_s."""

    name: str
    compile_forward_s: (
        float  # one torch.compile of FlexAttention (or RoPE), forward, one shape
    )
    compile_backward_s: (
        float  # the same with its backward (forward and backward graphs)
    )
    tflops: float  # FLOP/s (in 1e12) the attention kernels achieve
    bandwidth_gbs: (
        float  # bytes/s (in 1e9) an elementwise or materialising path achieves
    )
    call_overhead_ms: float  # launch and Python overhead of one call
    fixed_s: float  # imports, device start, block fractions, the matmul reference


BUDGET_MARGIN = 1.5  # a preset without a time budget gets this many times its estimate
COST_MODELS = {
    "t4": CostModel("t4", compile_forward_s=12.0, compile_backward_s=30.0, tflops=20.0, bandwidth_gbs=220.0, call_overhead_ms=0.1, fixed_s=20.0),
    "a100": CostModel("a100", compile_forward_s=8.0, compile_backward_s=20.0, tflops=150.0, bandwidth_gbs=1300.0, call_overhead_ms=0.05, fixed_s=15.0),
    "h100": CostModel("h100", compile_forward_s=6.0, compile_backward_s=15.0, tflops=300.0, bandwidth_gbs=2500.0, call_overhead_ms=0.05, fixed_s=15.0),
    "cpu": CostModel("cpu", compile_forward_s=15.0, compile_backward_s=40.0, tflops=0.05, bandwidth_gbs=10.0, call_overhead_ms=0.05, fixed_s=5.0),
}  # fmt: skip
REFERENCE_BACKENDS = 3  # causal SDPA backends timed per shape and pass to choose the baseline's (cuDNN, flash, efficient)
BACKEND_CALLS = 4  # calls per backend when choosing (one warm-up, three timed)


def budget(
    preset: str | Preset,
    device_memory: int | None = None,
    dtype: torch.dtype = torch.float32,
    model: str | CostModel | None = None,
) -> dict:
    """Compiles and calls of a preset's plan, and the seconds they take under `model` (default: "t4" on cuda, "cpu").

    Per measurement that runs: its check (one call of the path, one of its reference per scheme,
    pass and shape), `warmup` calls, `repeats` timed rounds, one call for peak memory and one with
    fresh caches for the kept bytes. Per shape and pass on a GPU, the causal SDPA backends are timed
    to choose the baseline's. A compiled path compiles once per shape and pass (dynamic=False), at
    its check. A call takes overhead + max(FLOPs / FLOP/s, bytes / bandwidth), its bytes the memory
    estimate of `estimate_bytes`; on a GPU each timed call is preceded by an L2 flush (its bytes).
    """
    preset = get_preset(preset)
    model = (
        COST_MODELS[model or ("t4" if preset.device == "cuda" else "cpu")]
        if not isinstance(model, CostModel)
        else model
    )
    tasks = [t for t in plan(preset, device_memory, dtype) if t.skip is None]
    compiles = Counter(t.pass_ for t in tasks if t.path in COMPILED)
    calls = compile_s = run_s = 0.0
    flush = (preset.l2_flush_bytes or 2 * 50 * 2**20) if preset.device == "cuda" else 0
    references = set()
    for t in tasks:
        dt = t.dtype or dtype
        operation = t.scheme in OPERATION_PATHS
        flops = (
            0
            if operation
            else nominal_flops(
                t.pass_, t.batch, preset.heads, t.seq_len, preset.head_dim
            )
        )
        traffic = estimate_bytes(
            t.scheme,
            t.path,
            t.pass_,
            t.batch,
            preset.heads,
            t.seq_len,
            preset.head_dim,
            elt(dt),
        )
        one = model.call_overhead_ms / 1e3 + max(
            flops / (model.tflops * 1e12), traffic / (model.bandwidth_gbs * 1e9)
        )
        n = 1 + preset.warmup + preset.repeats + 2
        references.add((t.scheme, t.pass_, t.seq_len, t.batch, t.dtype))
        calls += n
        run_s += n * one + preset.repeats * flush / (model.bandwidth_gbs * 1e9)
        if t.path in COMPILED:
            compile_s += (
                model.compile_backward_s
                if t.pass_ == BACKWARD
                else model.compile_forward_s
            )
    shapes = {
        (t.seq_len, t.batch, t.pass_) for t in tasks if t.scheme not in OPERATION_PATHS
    }
    if preset.device == "cuda":
        for length, batch, pass_ in shapes:
            flops = nominal_flops(pass_, batch, preset.heads, length, preset.head_dim)
            calls += REFERENCE_BACKENDS * BACKEND_CALLS
            run_s += (
                REFERENCE_BACKENDS
                * BACKEND_CALLS
                * (model.call_overhead_ms / 1e3 + flops / (model.tflops * 1e12))
            )
    calls += len(references)
    estimate = round(
        model.fixed_s
        + compile_s
        + run_s
        + 2 * len(references) * model.call_overhead_ms / 1e3,
        1,
    )
    return {
        "preset": preset.name, "model": dataclasses.asdict(model), "measurements": len(tasks), "compiles": sum(compiles.values()),
        "compiles_by_pass": dict(compiles), "calls": int(calls), "compile_s": round(compile_s, 1), "run_s": round(run_s, 1),
        "estimate_s": estimate, "time_budget_s": time_budget(preset, estimate),
    }  # fmt: skip


def time_budget(preset: Preset, estimate_s: float) -> float:
    """The preset's own budget where it states one, else BUDGET_MARGIN times the estimate."""
    return (
        float(preset.time_budget_s)
        if preset.time_budget_s is not None
        else round(BUDGET_MARGIN * estimate_s, 0)
    )
