"""What positions cost: time and peak memory of every kernel path a scheme can take
through posenc.attention.

    python -m posenc.study.benchmark --preset cpu --runs 3     # every path, L <= 2048
    python -m posenc.study.benchmark --preset kernel --runs 3  # L = 4096, the goals
    python -m posenc.study.benchmark --preset colab            # one GPU: 8k and 4k
    python -m posenc.study.benchmark --preset gpu              # one GPU: 512 to 32k

writes ``benchmark_<preset>.csv`` (one row per measurement and run, the columns of
`COLUMNS`) and ``benchmark_<preset>.json`` (posenc.study.runinfo's metadata, plus block
fractions, first-call times, the time budget and its estimate, every sample's time, and
the goals) to `posenc.study.results.results_dir()` unless --out says otherwise. Rows are
appended after every group of measurements, so a run stopped early keeps what it
measured (its metadata says "complete": false). `--runs N` makes N runs, each in a fresh
process, one after the other, and judges each goal on all of them: met only where met in
every run. Presets and plans are in posenc.study.presets, the paths in
posenc.study.bench_paths, the goals in posenc.study.goals.

Each path is first checked against its reference at the shape it is timed at (outputs,
and gradients for the forward+backward pass). Then all the paths of one shape and pass
are timed interleaved: every round takes one sample of each path, a sample being a few
calls back to back (enough to last `min_sample_ms`), after a warm-up; the ratio to the
baseline is the median of the per-round ratios, with its quartiles. The baseline of an
attention group is plain causal attention through posenc.attention on SDPA, on a GPU the
fastest of SDPA's fused backends there; RoPE and the copies of its bytes are a group of
their own (forward, never between attention calls), whose baseline is the copy into a
preallocated buffer. On a GPU, CUDA events around every call, an L2 flush before each,
and no synchronisation until a sample's calls are issued; perf_counter elsewhere, with
the page faults and the process's share of the processor per sample, and glibc's
allocator held steady where the preset says. Peak memory is measured after all timing,
each figure marked with its counter and whether it is exact or a lower bound; the bytes
a path keeps per shape (a dense mask for SDPA) are measured apart, with fresh caches. A
path the device or this torch cannot run is recorded as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from .bench_budget import budget, cost_model_for, time_budget  # noqa: F401
from .bench_files import (  # noqa: F401
    COLUMNS,
    FORMAT,
    merge_runs,
    read_metadata,
    read_rows,
    read_run,
    result_paths,
    sample_key,
    write_results,
)
from .bench_paths import (  # noqa: F401
    BACKWARD,
    COMPILED,
    FORWARD,
    PASSES,
    TOLERANCE,
    Runner,
    SkipPath,
)
from .bench_plan import (  # noqa: F401
    TINY_ENV,
    preset_here,
    tiny,
    Task,
    choose_dtype,
    elt,
    estimate_bytes,
    memory_limit,
    nominal_flops,
    plan,
)
from . import bench_run  # noqa: F401
from .bench_run import (  # noqa: F401
    block_fractions,
    execute,
    measure_memory,
    run,
    run_group,
)
from .measure import summarize, time_call, time_rounds  # noqa: F401
from .presets import (  # noqa: F401
    ALL_SCHEMES,
    BASELINE,
    BASELINE_PATHS,
    OPERATION_BASELINE,
    OPERATION_PATHS,
    PRESETS,
    SCHEME_PATHS,
    SDPA_BACKEND_PATHS,
    Preset,
    get_preset,
)
from .results import results_dir


def run_fresh(
    preset: str,
    out: str | Path,
    runs: int,
    extra: tuple[str, ...] = (),
    log: Callable[[str], None] | None = print,
) -> tuple[list[dict], dict]:
    """`runs` runs of a preset, each in a fresh Python process (python -m
    posenc.study.benchmark), one after the other, merged into benchmark_<preset>.csv and
    .json under `out`."""
    parts = []
    with tempfile.TemporaryDirectory(prefix="posenc-benchmark-") as tmp:
        for i in range(1, runs + 1):
            folder = Path(tmp) / f"run{i}"
            if log is not None:
                log(f"run {i} of {runs}, in a fresh process")
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "posenc.study.benchmark",
                    "--preset",
                    preset,
                    "--out",
                    str(folder),
                    "--run-index",
                    str(i),
                    "--quiet",
                    *extra,
                ],
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"run {i} of preset {preset!r} failed (exit {done.returncode})"
                )
            name = (
                f"{preset.removesuffix('_tiny')}_tiny" if "--tiny" in extra else preset
            )
            parts.append(read_run(name, folder, only=True))
    rows, meta = merge_runs(parts)
    write_results(rows, meta, out)
    return rows, meta


def print_goals(meta: dict) -> None:
    for g in meta["goals"]:
        value = "not judged" if g["value"] is None else f"{g['value']:.3g}"
        print(
            f"{g['goal']:<70} {g.get('dtype', ''):<9} L={g.get('seq_len', ''):<6} "
            f"{value:>10}  goal {g['bound']:<9} {g['verdict']}"
            + (f" ({g['reason'][:70]})" if g["met"] is None and g.get("reason") else "")
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posenc.study.benchmark", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument(
        "--out",
        default=str(results_dir()),
        help="folder for benchmark_<preset>.csv and .json (default: "
        "posenc.study.results.results_dir(), here %(default)s)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="runs of the preset, each in a fresh process, merged into one result "
        "(the stored CPU runs: 3)",
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
        "--time-budget",
        type=float,
        help="seconds after which the remaining measurements are skipped "
        "(default: the preset's)",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="the preset at tiny shapes (seconds; for tests)",
    )
    parser.add_argument("--run-index", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument(
        "--quiet", action="store_true", help="do not print one line per measurement"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be a positive integer, got {args.runs}")
    if args.runs > 1:
        extra = tuple(
            [
                *(["--compile-flex"] if args.compile_flex else []),
                *(["--tiny"] if args.tiny else []),
                *(["--schemes", *args.schemes] if args.schemes else []),
                *(
                    ["--time-budget", str(args.time_budget)]
                    if args.time_budget is not None
                    else []
                ),
            ]
        )
        try:
            rows, meta = run_fresh(
                args.preset, args.out, args.runs, extra, None if args.quiet else print
            )
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        name = meta["preset"]
    else:
        preset = tiny(args.preset) if args.tiny else PRESETS[args.preset]
        if args.compile_flex:
            preset = dataclasses.replace(preset, compile_flex=True)
        try:
            rows, meta = run(
                preset,
                args.out,
                schemes=None if args.schemes is None else tuple(args.schemes),
                log=None if args.quiet else lambda line: print(line, flush=True),
                time_budget_s=args.time_budget,
                run_index=args.run_index,
            )
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        name = preset.name
    print_goals(meta)
    ok = sum(r["status"] == "ok" for r in rows)
    csv_path, json_path = result_paths(args.out, name)
    print(
        f"{ok} measurements, {len(rows) - ok} skipped, in {meta['elapsed_s']} s: "
        f"{csv_path} and {json_path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
