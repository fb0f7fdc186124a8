"""One run of the benchmark: its groups checked and timed, then its memory, written as
it goes.

`run` plans a preset (posenc.study.bench_plan), times every group of measurements with
`run_group` (checks first, then interleaved rounds, each ratio to the group's fastest
baseline), appends each group's rows to the CSV, measures memory after all timing
(`measure_memory`), and writes the metadata (posenc.study.runinfo's, with the samples
and the goals). posenc.study.benchmark is its command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .bench_budget import budget, cost_model_for
from .bench_files import FORMAT, _Files, describe, sample_key
from .bench_paths import FORWARD, Runner, SkipPath, _first_line
from .bench_plan import (
    Task,
    block_fractions,
    choose_dtype,
    elt,
    memory_limit,
    plan,
    task_row,
)
from .measure import COUNTERS, steady_allocator, summarize, time_call, time_rounds
from .presets import (
    ALL_SCHEMES,
    BASELINE,
    BASELINE_PATHS,
    OPERATION_BASELINE,
    OPERATION_PATHS,
    Preset,
    get_preset,
)
from .runinfo import cuda_info, gpu_clocks, load_average, run_metadata


@contextlib.contextmanager
def _run_settings(preset: Preset) -> Iterator[None]:
    """Threads as the preset says, room for every compiled variant, and no warnings on
    the way."""
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
            # first compiles warn; the reasons are recorded instead
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.set_num_threads(threads)
        for n, value in saved.items():
            setattr(config, n, value)


def _why(exc: BaseException, runner: Runner | None = None, task=None) -> str:
    """The reason a path did not run; compiled FlexAttention failing on a GPU below
    compute capability 8.0 also names the GPU and what to do."""
    if isinstance(exc, SkipPath):
        return str(exc)
    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory"
    why = f"{type(exc).__name__}: {_first_line(exc)}"
    if runner is None or task is None or runner.device.type != "cuda":
        return why
    major, minor = torch.cuda.get_device_capability(runner.device)
    if task.path in ("flex", "flex_direct") and major < 8:
        name = torch.cuda.get_device_name(runner.device)
        why += (
            f" (on {name}, compute capability {major}.{minor}: Triton supports 8.0 and "
            "up, and FlexAttention's kernels need its shared memory; on Colab choose "
            "an L4 or A100 runtime)"
        )
    return why


def _is_baseline(task: Task) -> bool:
    return (task.scheme, task.path) == OPERATION_BASELINE or (
        task.scheme == BASELINE[0] and task.path in BASELINE_PATHS
    )


def run_group(runner: Runner, tasks: list[Task], budget_s: float) -> list[dict]:
    """The rows of the tasks of one group (one shape and pass, or the copy and RoPE
    group): each checked, then all timed interleaved, each ratio taken to the group's
    fastest baseline.

    The samples go to runner.samples (by sample_key); memory is measured later
    (measure_memory).
    """
    p, rows, ready = runner.preset, {}, {}
    operations = tasks[0].scheme in OPERATION_PATHS
    for task in tasks:
        row = rows[task] = task_row(p, task, runner.dtype, runner.fractions)
        row["run"] = runner.run_index
        if task.skip or time.perf_counter() - runner.start > budget_s:
            row["reason"] = (
                task.skip
                or f"the run's time budget of {budget_s:.0f} s was used up before this "
                "measurement"
            )
            continue
        try:
            row["max_abs_err"] = runner.check(task)
            row["check_seq_len"] = task.seq_len
            row["reference_chunk"] = runner.reference_chunks.get(
                f"{task.scheme}/{task.pass_}/{task.seq_len}/{task.batch}"
            )
            ready[task] = runner.step(task, task.seq_len)[0]
        # noqa: BLE001 - a path this device or torch cannot run: record why
        except Exception as exc:
            row["reason"] = _why(exc, runner, task)
        finally:
            if runner.device.type == "cuda":
                torch.cuda.empty_cache()
    if not ready:
        return [_logged(runner, rows[t]) for t in tasks]
    names = {f"{t.scheme}/{t.path}/{t.dtype_name}": t for t in ready}
    samples, failed = time_rounds(
        {name: ready[t] for name, t in names.items()},
        runner.device,
        p.warmup,
        (p.op_repeats or p.repeats) if operations else p.repeats,
        runner.flush(),
        min_sample_ms=p.op_sample_ms if operations else p.min_sample_ms,
        min_calls=p.min_calls,
    )
    for name, task in names.items():
        row = rows[task]
        if name in failed:
            row["reason"] = _why(failed[name], runner, task)
            continue
        s = samples[name]
        row["median_ms"], row["q25_ms"], row["q75_ms"] = summarize(s.ms)
        faults = [f for f in s.faults if f is not None]
        shares = [c for c in s.cpu_share if c is not None]
        row.update(
            min_ms=min(s.ms),
            host_ms=statistics.median(s.host_ms),
            calls=s.calls,
            faults_per_call=statistics.median(faults) if faults else None,
            cpu_share=statistics.median(shares) if shares else None,
            status="ok",
            repeats=len(s.ms),
        )
        runner.samples[sample_key(row)] = [float(f"{t:.6g}") for t in s.ms]
    for dtype in {t.dtype for t in names.values()}:
        timed = {n: t for n, t in names.items() if t.dtype == dtype and n in samples}
        bases = [n for n, t in timed.items() if _is_baseline(t)]
        if not bases:
            continue
        base = min(bases, key=lambda n: rows[timed[n]]["median_ms"])
        for name, task in timed.items():
            rows[task]["baseline"] = timed[base].path
            rows[task]["ratio"], rows[task]["ratio_q25"], rows[task]["ratio_q75"] = (
                summarize([a / b for a, b in zip(samples[name].ms, samples[base].ms)])
            )
    return [_logged(runner, rows[t]) for t in tasks]


def measure_memory(runner: Runner, rows: list[dict], tasks: dict[int, Task]) -> None:
    """Peak and kept memory of every row that was timed, after all timing.

    Memory is measured in a phase of its own: the resident-peak counter trims the heap
    first, which would change the allocator's state for the timings that follow it. Each
    path is called once first, as in its timing, so that what it builds once per shape
    (a mask evicted since by other shapes) is not counted as a call's.
    """
    for i, row in enumerate(rows):
        task = tasks.get(i)
        if task is None or row["status"] != "ok":
            continue
        try:
            fn, _, reset = runner.step(task, task.seq_len)
            fn()
            row["peak_mem_bytes"], row["memory_counter"] = runner.memory(
                task, fn, reset
            )
            row["memory_bound"] = COUNTERS.get(row["memory_counter"], "")
            row["kept_bytes"] = runner.kept(task)
        except Exception as exc:  # noqa: BLE001
            row["reason"] = f"memory not measured: {_why(exc)}"
        finally:
            if runner.device.type == "cuda":
                torch.cuda.empty_cache()


def execute(runner: Runner, task: Task) -> dict:
    """One task alone, checked, timed and measured (no baseline to interleave with: no
    ratio)."""
    budget_s = runner.preset.time_budget_s
    row = run_group(runner, [task], float("inf") if budget_s is None else budget_s)[0]
    measure_memory(runner, [row], {0: task})
    return row


def _logged(runner: Runner, row: dict) -> dict:
    if runner.log is not None:
        timing = (
            f"{row['median_ms']:10.3f} ms"
            if row["status"] == "ok"
            else f"skipped: {row['reason'][:70]}"
        )
        runner.log(
            f"{row['scheme']:>14} {row['path']:<16} {row['pass']:<17} "
            f"{row['dtype']:<9} "
            f"L={row['seq_len']:<6} B={row['batch']:<3} {timing}"
        )
    return row


def _groups(tasks: list[Task]) -> list[list[Task]]:
    """Tasks measured together, in plan order: per length the copy and RoPE group, then
    each pass's attention paths."""
    groups: dict[tuple, list[Task]] = {}
    for t in tasks:
        kind = "operations" if t.scheme in OPERATION_PATHS else "attention"
        groups.setdefault((t.seq_len, t.batch, t.pass_, kind), []).append(t)
    return list(groups.values())


def _warm_up_gpu(device: torch.device, size: int, seconds: float = 1.0) -> None:
    """About a second of matrix products (of the preset's matmul size), so that the
    GPU's clocks have risen before anything is timed."""
    a = torch.randn(size, size, device=device, dtype=torch.float16)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize(device)


def run(
    preset: str | Preset,
    out: str | Path | None = None,
    *,
    schemes: tuple[str, ...] | None = None,
    log: Callable[[str], None] | None = None,
    time_budget_s: float | None = None,
    run_index: int = 1,
) -> tuple[list[dict], dict]:
    """Run every measurement of a preset once; returns (rows, metadata), and writes them
    under `out` if given.

    The CSV gains each group's rows as soon as they are timed, and the metadata follows;
    memory is measured after all timing, and the files are then rewritten whole.
    `schemes` keeps only the measurements of those schemes (the baselines are always
    measured); `time_budget_s` replaces the preset's budget (after it, measurements are
    skipped with that reason); `run_index` is the run column's value
    (posenc.study.benchmark --runs numbers them).
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
                f"unknown schemes {unknown}; the benchmark measures "
                f"{', '.join(ALL_SCHEMES)}"
            )
        keep = (
            set(schemes)
            | {BASELINE[0]}
            | ({OPERATION_BASELINE[0]} if "rope" in schemes else set())
        )
        preset = dataclasses.replace(
            preset, schemes=tuple(s for s in preset.schemes if s in keep)
        )
    if log is not None and not callable(log):
        raise TypeError(f"log must be callable or None; got {type(log).__name__}")
    device = torch.device(preset.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"preset {preset.name!r} needs a CUDA device and none is available here; "
            "run --preset cpu"
        )
    dtype = choose_dtype(device)
    gpu = cuda_info(device)
    memory = gpu["total_memory_bytes"] if device.type == "cuda" else None
    tasks = plan(preset, memory, dtype)
    if schemes is not None and BASELINE[0] not in schemes:
        tasks = [
            t for t in tasks if t.scheme != BASELINE[0] or t.path in BASELINE_PATHS
        ]
    capability = (
        tuple(int(x) for x in gpu["capability"].split("."))
        if gpu["capability"]
        else None
    )
    estimate = budget(preset, memory, dtype, cost_model_for(capability))
    budget_s = (
        estimate["time_budget_s"] if time_budget_s is None else float(time_budget_s)
    )
    allocator = steady_allocator() if preset.steady_allocator else None
    files = _Files(out, preset.name)

    with _run_settings(preset):
        meta = run_metadata(preset.name, preset, device, dtype)
        meta.update(
            format=FORMAT, complete=False, allocator=allocator, time_budget_s=budget_s
        )
        runner = Runner(preset, device, dtype, log, memory_limit(preset, memory))
        runner.run_index, runner.samples = run_index, {}
        runner.fractions = block_fractions(preset, device)
        if device.type == "cuda":
            _warm_up_gpu(device, min(preset.matmul_size, 4096))
        rows, row_tasks, clocks = [], {}, []
        for group in _groups(tasks):
            done = run_group(runner, group, budget_s)
            row_tasks.update({len(rows) + i: t for i, t in enumerate(group)})
            rows += done
            files.append(done)
            if device.type == "cuda":
                clocks.append(
                    {
                        "group": f"L={group[0].seq_len} {group[0].pass_}"
                        + (
                            ", copy and RoPE"
                            if group[0].scheme in OPERATION_PATHS
                            else ""
                        ),
                        **(gpu_clocks() or {}),
                    }
                )
            describe(
                meta, preset, device, dtype, rows, runner, estimate, schemes, clocks
            )
            files.metadata(meta)
        measure_memory(runner, rows, row_tasks)
        rows.append(_matmul_row(preset, device, dtype, log, run_index))
    describe(meta, preset, device, dtype, rows, runner, estimate, schemes, clocks)
    meta.update(complete=True, load_average_end=load_average())
    meta = json.loads(json.dumps(meta))  # as the file holds it: lists, not tuples
    files.finish(rows, meta)
    return rows, meta


def _matmul_row(
    preset: Preset, device: torch.device, dtype: torch.dtype, log, run_index: int = 1
) -> dict:
    """A square matrix product, the device's compute reference (FLOP/s) for the
    roofline."""
    n = preset.matmul_size
    gen = torch.Generator().manual_seed(n)
    a, b = (torch.randn(n, n, generator=gen).to(device, dtype) for _ in range(2))
    median, q25, q75 = summarize(
        time_call(lambda: a @ b, device, max(preset.warmup, 1), preset.repeats)
    )
    if log is not None:
        log(f"{'matmul':>14} {'mm':<16} {FORWARD:<17} n={n:<6} {median:10.3f} ms")
    return {
        **task_row(preset, Task("matmul", "mm", FORWARD, n, 1), dtype),
        "run": run_index,
        "heads": 1,
        "head_dim": n,
        "median_ms": median,
        "q25_ms": q25,
        "q75_ms": q75,
        "status": "ok",
        "flops": 2 * n**3,
        "bytes_moved": 3 * n * n * elt(dtype),
        "repeats": preset.repeats,
    }
