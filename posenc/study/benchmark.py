"""What positions cost: time and peak memory of every kernel path a scheme can take through posenc.attention.

    python -m posenc.study.benchmark --preset cpu      # every path, L up to 2048, one CPU thread
    python -m posenc.study.benchmark --preset kernel   # the fast paths at L = 4096, one CPU thread, with goals
    python -m posenc.study.benchmark --preset colab    # Colab's GPU: the goals' paths at 4k and 8k, both passes
    python -m posenc.study.benchmark --preset gpu      # every path, 512 to 32k, on one GPU

writes ``benchmark_<preset>.csv`` (one row per measurement, the columns of `COLUMNS`) and
``benchmark_<preset>.json`` (posenc.study.runinfo's metadata, plus block fractions, first-call
times, the time budget and its estimate, and the goals) to `posenc.study.results.results_dir()`
unless --out says otherwise. Presets and plans are in posenc.study.presets, the paths in
posenc.study.bench_paths, the goals in posenc.study.goals.

Each path is first checked against its reference (outputs, and gradients for the forward+backward
pass). Then all the paths of one shape and pass are timed interleaved with the baseline (causal
attention through posenc.attention on SDPA; on a GPU the fastest SDPA backend at that shape and
pass): every round times each path once, after a warm-up; the ratio to the baseline is the median
of the per-round ratios, with its quartiles. On a GPU, CUDA events and an L2 flush before every
timed call; perf_counter elsewhere. Peak memory is marked with its counter and whether it is exact
or a lower bound; the bytes a path keeps per shape (a dense mask for SDPA) are measured apart, with
fresh caches. A path the device or this torch cannot run is recorded as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import io
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .bench_paths import (
    BACKWARD,
    COMPILED,
    FORWARD,
    PASSES,
    REFERENCE,
    TOLERANCE,
    Runner,
    SkipPath,
    _first_line,
)  # noqa: F401 - BACKWARD, PASSES: public here
from .goals import goals
from .measure import COUNTERS, summarize, time_call, time_rounds
from .presets import (  # noqa: F401 - the benchmark's public names, importable from here
    ALL_SCHEMES, BASELINE, OPERATION_PATHS, PRESETS, SCHEME_PATHS, TINY_ENV, Preset, Task, budget, choose_dtype, elt, estimate_bytes,
    get_preset, memory_limit, nominal_flops, plan, preset_here, time_budget, tiny,
)  # fmt: skip
from .results import results_dir
from .runinfo import load_average, run_metadata

COLUMNS = (
    "preset", "device", "scheme", "path", "pass", "seq_len", "batch", "heads", "head_dim", "dtype",
    "median_ms", "q25_ms", "q75_ms", "ratio", "ratio_q25", "ratio_q75", "backend",
    "peak_mem_bytes", "memory_counter", "memory_bound", "kept_bytes", "status", "reason",
    "flops", "bytes_moved", "check_seq_len", "max_abs_err", "repeats",
)  # fmt: skip
NUMERIC = {"seq_len": int, "batch": int, "heads": int, "head_dim": int, "median_ms": float, "q25_ms": float, "q75_ms": float, "ratio": float,
           "ratio_q25": float, "ratio_q75": float, "peak_mem_bytes": int, "kept_bytes": int, "flops": int, "bytes_moved": int,
           "check_seq_len": int, "max_abs_err": float, "repeats": int}  # fmt: skip


@contextlib.contextmanager
def _run_settings(preset: Preset) -> Iterator[None]:
    """Threads as the preset says, room for every compiled variant, and no warnings on the way."""
    threads, config = torch.get_num_threads(), torch._dynamo.config
    names = [
        n
        for n in (
            "recompile_limit",
            "cache_size_limit",
            "accumulated_recompile_limit",
            "accumulated_cache_size_limit",
        )
        if hasattr(config, n)
    ]
    saved = {n: getattr(config, n) for n in names}
    try:
        if preset.threads is not None:
            torch.set_num_threads(preset.threads)
        for n in names:
            setattr(config, n, max(256, saved[n]))
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # first compiles warn; the reasons are recorded instead
            yield
    finally:
        torch.set_num_threads(threads)
        for n, value in saved.items():
            setattr(config, n, value)


def _row(preset: Preset, task: Task, dtype: torch.dtype) -> dict:
    n = task.batch * preset.heads * task.seq_len * preset.head_dim
    operation = task.scheme in OPERATION_PATHS
    row = dict.fromkeys(COLUMNS)
    row.update(
        preset=preset.name, device=preset.device, scheme=task.scheme, path=task.path, pass_=None, seq_len=task.seq_len, batch=task.batch,
        heads=preset.heads, head_dim=preset.head_dim, dtype=str(task.dtype or dtype).removeprefix("torch."), status="skipped", reason="",
        flops=(6 * n if task.scheme == "rope" else 0) if operation else nominal_flops(task.pass_, task.batch, preset.heads, task.seq_len, preset.head_dim),
        bytes_moved=4 * n * elt(task.dtype or dtype) if operation else (4 if task.pass_ == FORWARD else 12) * n * elt(task.dtype or dtype),
    )  # fmt: skip
    row.pop("pass_")
    row["pass"] = task.pass_
    return row


def _why(exc: BaseException) -> str:
    if isinstance(exc, SkipPath):
        return str(exc)
    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def run_group(
    runner: Runner,
    tasks: list[Task],
    fits: Callable[[Task, int], bool],
    budget_s: float,
) -> list[dict]:
    """The rows of the tasks of one shape and pass: each checked, then all timed interleaved (the baseline among them), then memory."""
    p, rows, ready = runner.preset, {}, {}
    for task in tasks:
        row = rows[task] = _row(p, task, runner.dtype)
        if task.skip or time.perf_counter() - runner.start > budget_s:
            row["reason"] = (
                task.skip
                or f"the run's time budget of {budget_s:.0f} s was used up before this measurement"
            )
            continue
        try:
            if task.path == "sdpa_causal":
                row["backend"] = runner.choose_backend(task)
            candidates = sorted({*p.lengths, *p.long_lengths}, reverse=True)
            check_len = (
                task.seq_len
                if task.scheme in OPERATION_PATHS
                else next(
                    (n for n in candidates if n <= task.seq_len and fits(task, n)), None
                )
            )
            if check_len is None:
                raise SkipPath(
                    f"no planned length up to {task.seq_len} at which the reference path fits in memory for the check"
                )
            row["max_abs_err"], row["check_seq_len"] = (
                runner.check(task, check_len),
                check_len,
            )
            ready[task] = runner.step(task, task.seq_len)[0]
        except Exception as exc:  # noqa: BLE001 - a path this device or torch cannot run: record why
            row["reason"] = _why(exc)
        finally:
            if runner.device.type == "cuda":
                torch.cuda.empty_cache()
    if ready:
        names = {f"{t.scheme}/{t.path}/{t.dtype_name}": t for t in ready}
        times, failed = time_rounds(
            {name: ready[t] for name, t in names.items()},
            runner.device,
            p.warmup,
            p.repeats,
            runner.flush(),
        )
        base = next(
            (name for name, t in names.items() if (t.scheme, t.path) == BASELINE), None
        )
        for name, task in names.items():
            row = rows[task]
            if name in failed:
                row["reason"] = _why(failed[name])
                continue
            row["median_ms"], row["q25_ms"], row["q75_ms"] = summarize(times[name])
            if base in times:
                row["ratio"], row["ratio_q25"], row["ratio_q75"] = summarize(
                    [t / b for t, b in zip(times[name], times[base])]
                )
            try:  # after timing: nothing intercepts the timed calls
                row["peak_mem_bytes"], row["memory_counter"] = runner.memory(
                    task, ready[task]
                )
                row["memory_bound"] = COUNTERS.get(row["memory_counter"], "")
                row["kept_bytes"] = runner.kept(task)
                row.update(status="ok", repeats=len(times[name]))
            except Exception as exc:  # noqa: BLE001
                row["reason"] = _why(exc)
    return [_logged(runner, rows[t]) for t in tasks]


def execute(runner: Runner, task: Task, fits: Callable[[Task, int], bool]) -> dict:
    """One task alone (no baseline to interleave with: no ratio)."""
    return run_group(
        runner,
        [task],
        fits,
        runner.preset.time_budget_s
        if runner.preset.time_budget_s is not None
        else float("inf"),
    )[0]


def _logged(runner: Runner, row: dict) -> dict:
    if runner.log is not None:
        timing = (
            f"{row['median_ms']:10.3f} ms"
            if row["status"] == "ok"
            else f"skipped: {row['reason'][:70]}"
        )
        runner.log(
            f"{row['scheme']:>14} {row['path']:<16} {row['pass']:<17} {row['dtype']:<9} L={row['seq_len']:<6} B={row['batch']:<2} {timing}"
        )
    return row


def block_fractions(
    preset: Preset, device: torch.device
) -> dict[str, dict[str, float]]:
    """Fraction of (query block, key block) pairs FlexAttention computes, causal and windowed, per length."""
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


def _groups(tasks: list[Task]) -> list[list[Task]]:
    """Tasks of the same shape and pass, in plan order: the forward group of a length holds the copy and RoPE too."""
    groups: dict[tuple, list[Task]] = {}
    for t in tasks:
        groups.setdefault((t.seq_len, t.batch, t.pass_), []).append(t)
    return list(groups.values())


def run(
    preset: str | Preset,
    out: str | Path | None = None,
    *,
    schemes: tuple[str, ...] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[dict], dict]:
    """Run every measurement of a preset; returns (rows, metadata), and writes them under `out` if given.

    `schemes` keeps only the measurements of those schemes; the baseline is always measured.
    """
    preset = get_preset(preset)
    if schemes is not None:
        if not isinstance(schemes, (tuple, list)) or not all(
            isinstance(s, str) for s in schemes
        ):
            raise TypeError(f"schemes must be a tuple of scheme names; got {schemes!r}")
        unknown = sorted(set(schemes) - set(ALL_SCHEMES))
        if unknown:
            raise ValueError(
                f"unknown schemes {unknown}; the benchmark measures {', '.join(ALL_SCHEMES)}"
            )
        preset = dataclasses.replace(
            preset,
            schemes=tuple(
                s for s in preset.schemes if s in schemes or s == BASELINE[0]
            ),
        )
    if log is not None and not callable(log):
        raise TypeError(f"log must be callable or None; got {type(log).__name__}")
    device = torch.device(preset.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"preset {preset.name!r} needs a CUDA device and none is available here; run --preset cpu"
        )
    dtype = choose_dtype(device)
    memory = (
        torch.cuda.get_device_properties(device).total_memory
        if device.type == "cuda"
        else None
    )
    tasks = plan(preset, memory, dtype)
    if schemes is not None and BASELINE[0] not in schemes:
        tasks = [t for t in tasks if t.scheme != BASELINE[0] or t.path == BASELINE[1]]
    limit = memory_limit(preset, memory)
    estimate = budget(preset, memory, dtype)
    budget_s = estimate["time_budget_s"]

    def fits(task: Task, length: int) -> bool:
        ref = REFERENCE.get(task.scheme, "explicit")
        return (
            estimate_bytes(
                task.scheme,
                ref,
                task.pass_,
                task.batch,
                preset.heads,
                length,
                preset.head_dim,
                elt(dtype),
            )
            <= limit
        )

    with _run_settings(preset):
        meta = run_metadata(preset.name, preset, device, dtype)
        runner = Runner(preset, device, dtype, log)
        rows = [
            row
            for group in _groups(tasks)
            for row in run_group(runner, group, fits, budget_s)
        ]
        rows.append(_matmul_row(preset, device, dtype, log))
        fractions = block_fractions(preset, device)
    meta.update(
        elapsed_s=round(time.perf_counter() - runner.start, 1),
        load_average_end=load_average(),
        timer="CUDA events, an L2 flush before each timed call" if device.type == "cuda" else "time.perf_counter",
        timing="interleaved: every round times each path of a shape and pass once, the baseline among them; ratio = median of per-round ratios",
        memory={"cuda_allocator": "torch.cuda.max_memory_allocated above what was allocated before the call (exact)",
                "process_rss": "growth of the process's peak resident memory (VmHWM after resetting it), for compiled and FlexAttention calls on a CPU (a lower bound)",
                "tensors": "bytes of the tensors a call creates, at most, counted operator by operator (exact; not the scratch inside one kernel)",
                "kept_bytes": "bytes a path keeps after its first call at a shape (a dense mask), with fresh caches: a one-time allocation per shape"},
        tolerance=TOLERANCE[dtype], columns=list(COLUMNS), baseline={"scheme": BASELINE[0], "path": BASELINE[1], "through": "posenc.attention, backend='sdpa'"},
        baseline_backend=sorted({r["backend"] for r in rows if r.get("backend")}) or None,
        block_size=128, block_fractions=fractions, first_call_s=runner.first_call_s, budget=estimate,
        compiles_run=sum(1 for key in runner.first_call_s if key.split("/")[1] in COMPILED),
        compile_s_run=round(sum(s for key, s in runner.first_call_s.items() if key.split("/")[1] in COMPILED), 1),  # against budget's compile_s
        schemes=None if schemes is None else sorted(set(schemes)), goals=goals(rows, fractions, device.type, preset.goal_length),
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
    median, q25, q75 = summarize(
        time_call(lambda: a @ b, device, max(preset.warmup, 1), preset.repeats)
    )
    if log is not None:
        log(f"{'matmul':>14} {'mm':<16} {FORWARD:<17} n={n:<6} {median:10.3f} ms")
    return {**_row(preset, Task("matmul", "mm", FORWARD, n, 1), dtype), "heads": 1, "head_dim": n, "median_ms": median, "q25_ms": q25,
            "q75_ms": q75, "status": "ok", "flops": 2 * n**3, "bytes_moved": 3 * n * n * elt(dtype), "repeats": preset.repeats}  # fmt: skip


def read_rows(text: str) -> list[dict]:
    """The rows of a results CSV (its text, as read_result gives it), typed as run() returns them.

    Columns a CSV written before they existed lacks are None (its memory_bound is derived from its
    counter, its device is the CPU: every run stored before the column was a CPU run).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be the CSV's text (str); got {type(text).__name__}")
    rows = []
    for record in csv.DictReader(io.StringIO(text)):
        row = {c: record.get(c) or None for c in COLUMNS}
        row["reason"] = record.get("reason") or ""
        for column, kind in NUMERIC.items():
            row[column] = (
                None
                if row[column] is None
                else kind(float(row[column]))
                if kind is int
                else float(row[column])
            )
        row["device"] = row["device"] or "cpu"
        row["memory_bound"] = row["memory_bound"] or COUNTERS.get(
            row["memory_counter"] or ""
        )
        rows.append(row)
    return rows


def result_paths(out: str | Path, preset: str) -> tuple[Path, Path]:
    return Path(out) / f"benchmark_{preset}.csv", Path(out) / f"benchmark_{preset}.json"


def _cell(value) -> str:
    return (
        ""
        if value is None
        else f"{value:.6g}"
        if isinstance(value, float)
        else str(value)
    )


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


def read_run(
    preset: str, folder: str | Path | None = None
) -> tuple[list[dict], dict] | None:
    """(rows, metadata) of a run of `preset` where read_result finds its two files (results_dir() first); None where not run."""
    from .results import read_result

    if not isinstance(preset, str) or not preset:
        raise TypeError(f"preset must be a preset's name; got {preset!r}")
    text, meta = (
        read_result(f"benchmark_{preset}.csv", folder),
        read_result(f"benchmark_{preset}.json", folder),
    )
    return None if text is None or meta is None else (read_rows(text), json.loads(meta))


def read_metadata(out: str | Path, preset: str) -> dict | None:
    """The metadata of a stored run, or None where that preset has not been run yet."""
    _, json_path = result_paths(out, preset)
    return json.loads(json_path.read_text()) if json_path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posenc.study.benchmark", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument(
        "--out",
        default=str(results_dir()),
        help="folder for benchmark_<preset>.csv and .json (default: posenc.study.results.results_dir(), here %(default)s)",
    )
    parser.add_argument(
        "--compile-flex",
        action="store_true",
        help="also measure compiled FlexAttention where the preset leaves it out",
    )
    parser.add_argument(
        "--schemes",
        nargs="+",
        choices=ALL_SCHEMES,
        help="measure only these schemes (the baseline is always measured)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="do not print one line per measurement"
    )
    args = parser.parse_args(argv)
    preset = (
        PRESETS[args.preset]
        if not args.compile_flex
        else dataclasses.replace(PRESETS[args.preset], compile_flex=True)
    )
    try:
        rows, meta = run(
            preset,
            args.out,
            schemes=None if args.schemes is None else tuple(args.schemes),
            log=None if args.quiet else lambda line: print(line, flush=True),
        )
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for g in meta["goals"]:
        value = "not judged" if g["value"] is None else f"{g['value']:.3g}"
        verdict = (
            "met"
            if g["met"]
            else "NOT met"
            if g["met"] is False
            else f"({g['reason'][:80]})"
        )
        print(
            f"{g['goal']:<70} {g.get('dtype', ''):<9} L={g.get('seq_len', ''):<6} {value:>10}  goal {g['bound']:<9} {verdict}"
        )
    ok = sum(r["status"] == "ok" for r in rows)
    csv_path, json_path = result_paths(args.out, preset.name)
    print(
        f"{ok} measurements, {len(rows) - ok} skipped, in {meta['elapsed_s']} s: {csv_path} and {json_path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
