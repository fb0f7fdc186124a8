"""What positions cost: time and peak memory of every kernel path a scheme can take through posenc.attention.

    python -m posenc.study.benchmark --preset cpu      # every path, L up to 2048, one CPU thread
    python -m posenc.study.benchmark --preset kernel   # the fast paths at L = 4096, one CPU thread, with goals
    python -m posenc.study.benchmark --preset gpu      # every path, 512 to 32k, on one GPU

writes ``benchmark_<preset>.csv`` (one row per measurement, the columns of `COLUMNS`) and
``benchmark_<preset>.json`` (posenc.study.runinfo's metadata, plus the baseline backend,
block fractions, first-call times and the goals). The paths are in posenc.study.bench_paths.
Each path is first checked against its reference (outputs, and gradients for the
forward+backward pass), then timed side by side with the baseline in the same run:
medians and quartiles after a warm-up, CUDA events on a GPU, perf_counter elsewhere.
A path the device or this torch cannot run is recorded as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .bench_paths import BACKWARD, FORWARD, PASSES, REFERENCE, TOLERANCE, Runner, SkipPath, _first_line
from .measure import summarize, time_call
from .runinfo import load_average, run_metadata

COLUMNS = (
    "preset", "scheme", "path", "pass", "seq_len", "batch", "heads", "head_dim", "dtype",
    "median_ms", "q25_ms", "q75_ms", "peak_mem_bytes", "memory_counter", "status", "reason",
    "flops", "bytes_moved", "check_seq_len", "max_abs_err", "repeats",
)  # fmt: skip
BASELINE = ("nope", "sdpa_causal")  # (scheme, path) every ratio is taken against
SCHEME_PATHS: dict[str, tuple[str, ...]] = {
    "nope": ("sdpa_causal", "flex", "explicit", "sdpa", "flex_uncompiled"),  # nope/flex: plain causal FlexAttention
    "alibi": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "t5": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "shaw": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "sliding_window": ("flex", "explicit", "sdpa", "flex_uncompiled"),
    "shaw_values": ("explicit_naive", "explicit_gather"),
}
OPERATION_PATHS = {"copy": ("clone",), "rope": ("posenc", "posenc_compiled", "hf_eager")}  # outside the kernel, forward only
ALL_SCHEMES = (*SCHEME_PATHS, *OPERATION_PATHS)


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
    schemes: tuple[str, ...] = ALL_SCHEMES
    paths: tuple[str, ...] | None = None  # only these paths (and the baseline); None: all
    passes: tuple[str, ...] = PASSES
    rope_dtypes: tuple[str, ...] = ()  # dtypes RoPE is also measured in, besides the run's
    compile_flex: bool = True
    flex_uncompiled: bool = True  # uncompiled FlexAttention materialises the scores: worth measuring on a CPU only
    compile_backend: str = "inductor"
    hf_rope: bool = True
    max_bytes: int | None = None  # estimated peak above which a path is skipped; None: half the GPU's memory
    time_budget_s: float = 600.0
    description: str = ""


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu", "cpu", (256, 512, 1024, 2048), batch=1, heads=4, head_dim=64, threads=1, compile_flex=False, max_bytes=3 * 2**30,
        description="Every path but compiled flex, L up to 2048, one CPU thread (torch.set_num_threads(1)), float32.",
    ),
    "kernel": Preset(
        "kernel", "cpu", (4096,), batch=1, heads=8, head_dim=64, threads=1, repeats=5, window=256, passes=(FORWARD,),
        schemes=("nope", "alibi", "t5", "sliding_window", "rope"), paths=("sdpa_causal", "flex", "posenc", "posenc_compiled", "hf_eager"),
        rope_dtypes=("bfloat16",), max_bytes=4 * 2**30, description="The fast paths at L = 4096 (B=1, H=8, d=64), one CPU thread, "
        "forward (FlexAttention has no backward on the CPU); RoPE in float32 and bfloat16; the goals of posenc's kernel work.",
    ),
    "gpu": Preset(
        "gpu", "cuda", (4096, 8192, 16384, 512, 1024, 2048), batch=4, heads=16, head_dim=64, long_lengths=(32768,), warmup=3, repeats=10,
        window=1024, matmul_size=8192, flex_uncompiled=False, time_budget_s=570.0,
        description="One GPU, bf16 where supported (fp16 otherwise); the lengths the goals need (4k and up) first; 32k at batch 1.",
    ),
    "tiny": Preset(
        "tiny", "cpu", (64, 128), batch=1, heads=2, head_dim=16, warmup=0, repeats=3, threads=1, window=16, shaw_max_distance=4,
        t5_buckets=8, t5_max_distance=32, matmul_size=64, hf_rope=False, compile_flex=False, compile_backend="aot_eager", max_bytes=2**28,
        time_budget_s=120.0, rope_dtypes=("bfloat16",), description="Seconds on a CPU, for tests and the chapter's live run: "
        "every path at tiny shapes; RoPE compiled with the aot_eager backend (traced, no code generated).",
    ),
}  # fmt: skip


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
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(repr(p) for p in PRESETS)}; got {preset!r}")
    return PRESETS[preset]


def choose_dtype(device: torch.device, bf16_supported: bool | None = None) -> torch.dtype:
    """float32 on the CPU; on a GPU bfloat16 where the hardware supports it natively, float16 otherwise (a T4, say)."""
    if torch.device(device).type != "cuda":
        return torch.float32
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.bfloat16 if bf16_supported else torch.float16


def _elt(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def nominal_flops(pass_: str, batch: int, heads: int, length: int, head_dim: int) -> int:
    """FLOPs of causal attention: 2 L^2 d per head forward (half of QK^T and PV), 3.5 times that forward+backward."""
    forward = 2 * batch * heads * length * length * head_dim
    return forward if pass_ == FORWARD else 7 * forward // 2


def estimate_bytes(scheme: str, path: str, pass_: str, batch: int, heads: int, length: int, head_dim: int, elt: int) -> int:
    """A deliberately generous estimate of a path's peak memory, to skip what cannot fit before trying it."""
    bhld = batch * heads * length * head_dim * elt
    if path.startswith("explicit") or path in ("sdpa", "flex_uncompiled"):
        estimate = (7 if pass_ == BACKWARD else 4) * batch * heads * length * length * 4 + 8 * bhld + 16 * length * length
        if path == "explicit_naive":  # the (L, L, d) relative tensors of keys and values
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


def plan(preset: str | Preset, device_memory: int | None = None, dtype: torch.dtype = torch.float32) -> list[Task]:
    """Every measurement of a preset, in the order it runs, each with the reason it will be skipped (or None)."""
    preset = get_preset(preset)
    limit = preset.max_bytes
    if limit is None:
        if device_memory is None:
            raise ValueError(f"preset {preset.name!r} sets no max_bytes: give device_memory (bytes)")
        limit = device_memory // 2
    wanted = lambda scheme, path: scheme in preset.schemes and (preset.paths is None or path in preset.paths or (scheme, path) == BASELINE)  # noqa: E731
    tasks = []
    for length, batch in [(n, preset.batch) for n in preset.lengths] + [(n, 1) for n in preset.long_lengths]:
        if wanted("copy", "clone"):
            tasks.append(Task("copy", "clone", FORWARD, length, batch))
        for dt in (None, *(getattr(torch, name) for name in preset.rope_dtypes)):
            tasks += [Task("rope", path, FORWARD, length, batch, _static_skip(preset, path), dt) for path in OPERATION_PATHS["rope"] if wanted("rope", path)]
        for scheme, paths in SCHEME_PATHS.items():
            for path in (p for p in paths if wanted(scheme, p)):
                for pass_ in preset.passes:
                    skip = _static_skip(preset, path)
                    need = estimate_bytes(scheme, path, pass_, batch, preset.heads, length, preset.head_dim, _elt(dtype))
                    if skip is None and need > limit:
                        skip = f"needs about {need / 2**30:.1f} GiB by estimate, over this run's limit of {limit / 2**30:.1f} GiB"
                    tasks.append(Task(scheme, path, pass_, length, batch, skip))
    return tasks


@contextlib.contextmanager
def _run_settings(preset: Preset) -> Iterator[None]:
    """Threads as the preset says, room for every compiled variant, and no warnings on the way."""
    threads, config = torch.get_num_threads(), torch._dynamo.config
    names = [n for n in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit") if hasattr(config, n)]
    saved = {n: getattr(config, n) for n in names}
    try:
        if preset.threads is not None:
            torch.set_num_threads(preset.threads)
        for n in names:
            setattr(config, n, max(256, saved[n]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # first compiles warn; the reasons are recorded instead
            yield
    finally:
        torch.set_num_threads(threads)
        for n, value in saved.items():
            setattr(config, n, value)


def _row(preset: Preset, task: Task, dtype: torch.dtype) -> dict:
    elt = _elt(task.dtype or dtype)
    n = task.batch * preset.heads * task.seq_len * preset.head_dim
    operation = task.scheme in OPERATION_PATHS
    return {
        "preset": preset.name, "scheme": task.scheme, "path": task.path, "pass": task.pass_, "seq_len": task.seq_len,
        "batch": task.batch, "heads": preset.heads, "head_dim": preset.head_dim, "dtype": str(task.dtype or dtype).removeprefix("torch."),
        "median_ms": None, "q25_ms": None, "q75_ms": None, "peak_mem_bytes": None, "memory_counter": None, "status": "skipped",
        "reason": "", "flops": (6 * n if task.scheme == "rope" else 0) if operation else nominal_flops(task.pass_, task.batch, preset.heads, task.seq_len, preset.head_dim),
        "bytes_moved": 4 * n * elt if operation else (4 if task.pass_ == FORWARD else 12) * n * elt,
        "check_seq_len": None, "max_abs_err": None, "repeats": None,
    }  # fmt: skip


def execute(runner: Runner, task: Task, fits: Callable[[Task, int], bool]) -> dict:
    """One row: check the path, time it, measure its memory; a skip with its reason where any step cannot run."""
    p = runner.preset
    row = _row(p, task, runner.dtype)
    if task.skip or time.perf_counter() - runner.start > p.time_budget_s:
        row["reason"] = task.skip or f"the preset's time budget of {p.time_budget_s:.0f} s was used up before this measurement"
        return _logged(runner, row)
    notes = []
    try:
        if task.path == "sdpa_causal" and runner.baseline_backend is None:
            runner.baseline_backend = runner.choose_baseline(*runner.inputs(task.seq_len, task.batch)[:3])
        candidates = sorted({*p.lengths, *p.long_lengths}, reverse=True)
        check_len = task.seq_len if task.scheme in OPERATION_PATHS else next((n for n in candidates if n <= task.seq_len and fits(task, n)), None)
        if check_len is None:
            raise SkipPath(f"no planned length up to {task.seq_len} at which the reference path fits in memory for the check")
        error = runner.check(task, check_len)
        fn, _ = runner.step(task, task.seq_len)
        times = time_call(fn, runner.device, p.warmup, p.repeats)
        row["median_ms"], row["q25_ms"], row["q75_ms"] = summarize(times)
        row["peak_mem_bytes"], row["memory_counter"] = runner.memory(task, fn)  # after timing: nothing intercepts the timed calls
        row.update(status="ok", check_seq_len=check_len, max_abs_err=error, repeats=p.repeats)
    except SkipPath as exc:
        notes.append(str(exc))
    except torch.OutOfMemoryError:
        notes.append("out of memory")
    except Exception as exc:  # noqa: BLE001 - a path this device or torch cannot run: record why
        notes.append(f"{type(exc).__name__}: {_first_line(exc)}")
    finally:
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()
    row["reason"] = "; ".join(notes)
    return _logged(runner, row)


def _logged(runner: Runner, row: dict) -> dict:
    if runner.log is not None:
        timing = f"{row['median_ms']:10.3f} ms" if row["status"] == "ok" else f"skipped: {row['reason'][:70]}"
        runner.log(f"{row['scheme']:>14} {row['path']:<16} {row['pass']:<17} {row['dtype']:<9} L={row['seq_len']:<6} B={row['batch']:<2} {timing}")
    return row


def block_fractions(preset: Preset, device: torch.device) -> dict[str, dict[str, float]]:
    """Fraction of (query block, key block) pairs FlexAttention computes, causal and windowed, per length."""
    from torch.nn.attention.flex_attention import create_block_mask

    from ..score.masks import causal, sliding_window

    fractions = {}
    for length in sorted({*preset.lengths, *preset.long_lengths}):
        dense = {name: create_block_mask(mod, None, None, length, length, device=device.type).to_dense() for name, mod in (("causal", causal), ("sliding_window", sliding_window(preset.window)))}
        fractions[str(length)] = {name: round(float(d.sum()) / d.numel(), 6) for name, d in dense.items()}
    return fractions


def run(preset: str | Preset, out: str | Path | None = None, *, schemes: tuple[str, ...] | None = None, log: Callable[[str], None] | None = None) -> tuple[list[dict], dict]:
    """Run every measurement of a preset; returns (rows, metadata), and writes them under `out` if given.

    `schemes` keeps only the measurements of those schemes; the baseline is always measured.
    """
    preset = get_preset(preset)
    if schemes is not None:
        unknown = sorted(set(schemes) - set(ALL_SCHEMES))
        if unknown:
            raise ValueError(f"unknown schemes {unknown}; the benchmark measures {', '.join(ALL_SCHEMES)}")
        preset = dataclasses.replace(preset, schemes=tuple(s for s in preset.schemes if s in schemes or s == BASELINE[0]))
    device = torch.device(preset.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"preset {preset.name!r} needs a CUDA device and none is available here; run --preset cpu")
    dtype = choose_dtype(device)
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    tasks = plan(preset, memory, dtype)
    if schemes is not None and BASELINE[0] not in schemes:
        tasks = [t for t in tasks if t.scheme != BASELINE[0] or t.path == BASELINE[1]]
    limit = preset.max_bytes if preset.max_bytes is not None else memory // 2

    def fits(task: Task, length: int) -> bool:
        ref = REFERENCE.get(task.scheme, "explicit")
        return estimate_bytes(task.scheme, ref, task.pass_, task.batch, preset.heads, length, preset.head_dim, _elt(dtype)) <= limit

    with _run_settings(preset):
        meta = run_metadata(preset.name, preset, device, dtype)
        runner = Runner(preset, device, dtype, log)
        rows = [execute(runner, task, fits) for task in tasks]
        rows.append(_matmul_row(preset, device, dtype, log))
        fractions = block_fractions(preset, device)
    meta.update(
        elapsed_s=round(time.perf_counter() - runner.start, 1),
        load_average_end=load_average(),
        timer="CUDA events" if device.type == "cuda" else "time.perf_counter",
        memory={"cuda_allocator": "torch.cuda.max_memory_allocated above what was allocated before the call",
                "process_rss": "growth of the process's peak resident memory (VmHWM after resetting it), for compiled and FlexAttention calls",
                "tensors": "bytes of the tensors a call creates, at most, counted operator by operator (posenc.study.measure.peak_memory)"},
        tolerance=TOLERANCE[dtype], columns=list(COLUMNS), baseline={"scheme": BASELINE[0], "path": BASELINE[1]},
        baseline_backend=runner.baseline_backend if device.type == "cuda" else "torch's default CPU kernel",
        block_size=128, block_fractions=fractions, first_call_s=runner.first_call_s,
        schemes=None if schemes is None else sorted(set(schemes)), goals=goals(rows, fractions),
    )  # fmt: skip
    meta = json.loads(json.dumps(meta))  # as the file holds it: lists, not tuples
    if out is not None:
        write_results(rows, meta, out)
    return rows, meta


def _matmul_row(preset: Preset, device: torch.device, dtype: torch.dtype, log) -> dict:
    """A square matrix product, the device's compute reference (FLOP/s) for the roofline."""
    n = preset.matmul_size
    gen = torch.Generator().manual_seed(n)
    a, b = (torch.randn(n, n, generator=gen).to(device, dtype) for _ in range(2))
    median, q25, q75 = summarize(time_call(lambda: a @ b, device, max(preset.warmup, 1), preset.repeats))
    if log is not None:
        log(f"{'matmul':>14} {'mm':<16} {FORWARD:<17} n={n:<6} {median:10.3f} ms")
    return {**_row(preset, Task("matmul", "mm", FORWARD, n, 1), dtype), "heads": 1, "head_dim": n, "median_ms": median, "q25_ms": q25,
            "q75_ms": q75, "status": "ok", "flops": 2 * n**3, "bytes_moved": 3 * n * n * _elt(dtype), "repeats": preset.repeats}  # fmt: skip


def goals(rows: list[dict], fractions: dict | None = None) -> list[dict]:
    """The kernel goals, judged on the rows of one run: ratios to the baseline (same length and pass) and peak memory."""
    ok = {(r["scheme"], r["path"], r["pass"], r["dtype"], r["seq_len"]): r for r in rows if r["status"] == "ok"}
    judged = []

    def judge(name: str, value: float | None, op: str, bound: float, length: int, unit: str = "x", **context) -> None:
        met = None if value is None else (value <= bound if op == "<=" else value >= bound)
        judged.append({"goal": name, "seq_len": length, "value": value, "bound": f"{op} {bound:g}{unit}", "met": met, **context})

    for (scheme, path, pass_, dt, length), row in sorted(ok.items(), key=lambda kv: kv[0][4]):
        base = ok.get((*BASELINE, pass_, dt, length))
        ratio = None if base is None else row["median_ms"] / base["median_ms"]
        if path == "flex" and length >= 4096 and pass_ == FORWARD and row["dtype"] == "float32":
            bound = {"sliding_window": 0.5, "alibi": 2.0, "t5": 2.5}.get(scheme)
            if bound is not None:
                plain = ok.get(("nope", "flex", pass_, dt, length))  # the same kernel without the scheme: what the scheme itself costs
                judge(f"{scheme} through compiled flex, time / causal SDPA", ratio, "<=", bound, length,
                      ratio_to_causal_flex=None if plain is None else row["median_ms"] / plain["median_ms"])
                judge(f"{scheme} through compiled flex, peak memory (MiB)", None if row["peak_mem_bytes"] is None else row["peak_mem_bytes"] / 2**20, "<=", 64, length, " MiB")
        if scheme == "rope" and path in ("posenc", "posenc_compiled"):
            hf = ok.get(("rope", "hf_eager", pass_, dt, length))
            if hf is not None:
                bound = 1.1 if path == "posenc" else 0.3
                judge(f"RoPE {path} / Hugging Face eager ({dt})", row["median_ms"] / hf["median_ms"], "<=", bound, length)
    return judged


def result_paths(out: str | Path, preset: str) -> tuple[Path, Path]:
    return Path(out) / f"benchmark_{preset}.csv", Path(out) / f"benchmark_{preset}.json"


def _cell(value) -> str:
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def write_results(rows: list[dict], meta: dict, out: str | Path) -> tuple[Path, Path]:
    """The tidy CSV (one row per measurement) and the JSON metadata, as benchmark_<preset>.csv/.json under `out`."""
    csv_path, json_path = result_paths(out, meta["preset"])
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows([_cell(row[c]) for c in COLUMNS] for row in rows)
    json_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return csv_path, json_path


def read_metadata(out: str | Path, preset: str) -> dict | None:
    """The metadata of a stored run, or None where that preset has not been run yet."""
    _, json_path = result_paths(out, preset)
    return json.loads(json_path.read_text()) if json_path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.study.benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", default="chapters/results", help="folder for benchmark_<preset>.csv and .json (default: %(default)s)")
    parser.add_argument("--compile-flex", action="store_true", help="also measure compiled FlexAttention where the preset leaves it out")
    parser.add_argument("--schemes", nargs="+", choices=ALL_SCHEMES, help="measure only these schemes (the baseline is always measured)")
    parser.add_argument("--quiet", action="store_true", help="do not print one line per measurement")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset] if not args.compile_flex else dataclasses.replace(PRESETS[args.preset], compile_flex=True)
    try:
        rows, meta = run(preset, args.out, schemes=None if args.schemes is None else tuple(args.schemes), log=None if args.quiet else lambda line: print(line, flush=True))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for g in meta["goals"]:
        value = "not measured" if g["value"] is None else f"{g['value']:.3g}"
        extra = f"  ({g['ratio_to_causal_flex']:.2f}x plain causal flex)" if g.get("ratio_to_causal_flex") else ""
        print(f"{g['goal']:<58} L={g['seq_len']:<6} {value:>12}  goal {g['bound']:<10} {'met' if g['met'] else 'NOT met' if g['met'] is False else ''}{extra}")
    ok = sum(r["status"] == "ok" for r in rows)
    csv_path, json_path = result_paths(args.out, preset.name)
    print(f"{ok} measurements, {len(rows) - ok} skipped, in {meta['elapsed_s']} s: {csv_path} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
