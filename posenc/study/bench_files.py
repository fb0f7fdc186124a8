"""The benchmark's files: one tidy CSV (a row per measurement and run) and one JSON of
metadata.

`COLUMNS` are the CSV's, `read_rows` types them back; `_Files` writes a run as it goes
(rows appended after every group, the metadata replaced whole, never half-written);
`merge_runs` makes one result of several runs; `read_run` finds a stored result where
posenc.study.results.read_result looks.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

import torch

from .bench_paths import TOLERANCE
from .goals import goals
from .measure import COUNTERS
from .presets import BASELINE, BASELINE_PATHS, OPERATION_BASELINE

FORMAT = 2  # of the files: rows per run, every sample kept, SDPA's backends as rows
COLUMNS = (
    "run",
    "preset",
    "device",
    "scheme",
    "path",
    "pass",
    "seq_len",
    "batch",
    "heads",
    "head_dim",
    "dtype",
    "median_ms",
    "q25_ms",
    "q75_ms",
    "min_ms",
    "ratio",
    "ratio_q25",
    "ratio_q75",
    "baseline",
    "backend",
    "host_ms",
    "faults_per_call",
    "cpu_share",
    "calls",
    "peak_mem_bytes",
    "memory_counter",
    "memory_bound",
    "kept_bytes",
    "status",
    "reason",
    "flops",
    "bytes_moved",
    "check_seq_len",
    "reference_chunk",
    "max_abs_err",
    "repeats",
)
NUMERIC = {
    "run": int,
    "seq_len": int,
    "batch": int,
    "heads": int,
    "head_dim": int,
    "median_ms": float,
    "q25_ms": float,
    "q75_ms": float,
    "min_ms": float,
    "ratio": float,
    "ratio_q25": float,
    "ratio_q75": float,
    "host_ms": float,
    "faults_per_call": float,
    "cpu_share": float,
    "calls": int,
    "peak_mem_bytes": int,
    "kept_bytes": int,
    "flops": int,
    "bytes_moved": int,
    "check_seq_len": int,
    "reference_chunk": int,
    "max_abs_err": float,
    "repeats": int,
}


def sample_key(row: dict) -> str:
    """The key of a row's samples in the metadata's samples_ms:
    run/scheme/path/pass/dtype/L/batch."""
    return "/".join(
        str(row[c])
        for c in ("run", "scheme", "path", "pass", "dtype", "seq_len", "batch")
    )


class _Files:
    """The run's two files, written as it goes: rows appended after every group, the
    metadata replaced whole (never left half-written: a kill keeps every finished
    group)."""

    def __init__(self, out: str | Path | None, preset: str):
        self.paths = None if out is None else result_paths(out, preset)
        if self.paths is not None:
            self.paths[0].parent.mkdir(parents=True, exist_ok=True)
            _replace(self.paths[0], _csv_text([], header=True))

    def append(self, rows: list[dict]) -> None:
        if self.paths is not None and rows:
            with self.paths[0].open("a", newline="") as f:
                f.write(_csv_text(rows, header=False))
                f.flush()

    def finish(self, rows: list[dict], meta: dict) -> None:
        if self.paths is not None:
            _replace(self.paths[0], _csv_text(rows, header=True))
            self.metadata(meta)

    def metadata(self, meta: dict) -> None:
        if self.paths is not None:
            _replace(self.paths[1], json.dumps(meta, indent=2, sort_keys=True) + "\n")


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` atomically: a file beside it, then os.replace."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


def _csv_text(rows: list[dict], header: bool) -> str:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    writer.writerows([_cell(row.get(c)) for c in COLUMNS] for row in rows)
    return text.getvalue()


def read_rows(text: str) -> list[dict]:
    """The rows of a results CSV (its text, as read_result gives it), typed as run()
    returns them.

    Columns a CSV written before they existed lacks are None (its memory_bound is
    derived from its counter, its device is the CPU: every run stored before the column
    was a CPU run; its run is 1).
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
        row["run"] = row["run"] or 1
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
    """The tidy CSV (one row per measurement) and the JSON metadata, as
    benchmark_<preset>.csv/.json under `out`."""
    csv_path, json_path = result_paths(out, meta["preset"])
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    _replace(csv_path, _csv_text(rows, header=True))
    _replace(json_path, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return csv_path, json_path


# what differs from run to run, kept per run in the merged metadata's "runs"
PER_RUN = (
    "date",
    "elapsed_s",
    "load_average_start",
    "load_average_end",
    "first_call_s",
    "compiles_run",
    "compile_s_run",
    "git",
    "package_sha256",
    "benchmarked_sha256",
    "complete",
    "allocator",
    "clocks",
    "time_budget_s",
    "reference_chunks",
)


def merge_runs(runs: list[tuple[list[dict], dict]]) -> tuple[list[dict], dict]:
    """Several runs of one preset as one result: their rows (each with its run), the
    first run's metadata with each run's own in "runs", every sample, and the goals
    judged on all of them."""
    if not runs:
        raise ValueError("merge_runs needs at least one run")
    rows = [dict(r, run=i) for i, (run_rows, _) in enumerate(runs, 1) for r in run_rows]
    meta = dict(runs[0][1])
    meta["runs"] = [
        {"run": i, **{k: m.get(k) for k in PER_RUN}} for i, (_, m) in enumerate(runs, 1)
    ]
    samples = {}
    for i, (_, m) in enumerate(runs, 1):
        for key, times in (m.get("samples_ms") or {}).items():
            samples[f"{i}/" + key.split("/", 1)[1]] = times
    meta.update(
        samples_ms=samples,
        complete=all(m.get("complete") for _, m in runs),
        elapsed_s=round(sum(m.get("elapsed_s") or 0 for _, m in runs), 1),
        load_average_end=runs[-1][1].get("load_average_end"),
        goals=goals(
            rows,
            meta.get("block_fractions"),
            meta["device"]["type"],
            meta["config"].get("goal_length", 4096),
            samples,
        ),
    )
    return rows, json.loads(json.dumps(meta))


def read_run(
    preset: str, folder: str | Path | None = None, only: bool = False
) -> tuple[list[dict], dict] | None:
    """(rows, metadata) of a run of `preset` where read_result finds its two files
    (results_dir() first); None where not run.

    `only=True` reads `folder` alone."""
    from .results import read_result

    if not isinstance(preset, str) or not preset:
        raise TypeError(f"preset must be a preset's name; got {preset!r}")
    if only:
        paths = result_paths(folder, preset)
        text, meta = (p.read_text() if p.is_file() else None for p in paths)
    else:
        text, meta = (
            read_result(f"benchmark_{preset}.csv", folder),
            read_result(f"benchmark_{preset}.json", folder),
        )
    return None if text is None or meta is None else (read_rows(text), json.loads(meta))


def read_metadata(out: str | Path, preset: str) -> dict | None:
    """The metadata of a stored run, or None where that preset has not been run yet."""
    _, json_path = result_paths(out, preset)
    return json.loads(json_path.read_text()) if json_path.exists() else None


def describe(
    meta, preset, device, dtype, rows, runner, estimate, schemes, clocks
) -> None:
    """The metadata of the run so far (complete or not), in `meta`."""
    cuda = device.type == "cuda"
    meta.update(
        elapsed_s=round(time.perf_counter() - runner.start, 1),
        timer="CUDA events around each call, an L2 flush before each, calls of a "
        "sample issued "
        "before waiting (the first of a sample left out)"
        if cuda
        else "time.perf_counter around each sample of calls",
        timing="interleaved: every round takes one sample of each path of a group "
        "(a few calls "
        "back to back), the baseline among them; ratio = median of per-round ratios to "
        "the "
        "group's fastest baseline (attention: SDPA's causal kernels; RoPE: the "
        "preallocated copy)",
        memory={
            "cuda_allocator": "torch.cuda.max_memory_allocated above what was "
            "allocated before the call (exact)",
            "process_rss": "growth of the process's peak resident memory (VmHWM after "
            "resetting it), for compiled and FlexAttention calls on a CPU (a lower "
            "bound)",
            "tensors": "bytes of the tensors a call creates, at most, counted operator "
            "by operator (exact; not the scratch inside one kernel)",
            "kept_bytes": "bytes a path keeps after its first call at a shape (a dense "
            "mask), with fresh caches: a one-time allocation per shape",
            "phase": "after all timing",
        },
        tolerance=TOLERANCE[dtype],
        columns=list(COLUMNS),
        baseline={
            "scheme": BASELINE[0],
            "paths": list(BASELINE_PATHS) if cuda else [BASELINE[1]],
            "through": "posenc.attention, backend='sdpa'",
            "rule": "the fastest at each shape and pass",
            "operations": "/".join(OPERATION_BASELINE),
        },
        baseline_backend=sorted(
            {
                r["baseline"]
                for r in rows
                if r.get("baseline") and r["scheme"] == BASELINE[0]
            }
        )
        or None,
        block_size=128,
        block_fractions=runner.fractions,
        first_call_s=runner.first_call_s,
        budget=estimate,
        reference_chunks=runner.reference_chunks,
        clocks=clocks or None,
        flex_kernel_options=_flex_options(device),
        flex_blocks_fitted=_flex_fitted(device),
        cpu_affinity=sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        compiles_run=sum(
            1
            for key in runner.first_call_s
            if key.split("/")[1] in ("flex", "posenc_compiled")
        ),
        compile_s_run=round(
            sum(
                s
                for key, s in runner.first_call_s.items()
                if key.split("/")[1] in ("flex", "posenc_compiled")
            ),
            1,
        ),
        schemes=None if schemes is None else sorted(set(schemes)),
        samples_ms=runner.samples,
        goals=goals(
            rows, runner.fractions, device.type, preset.goal_length, runner.samples
        ),
    )


def _flex_fitted(device: torch.device) -> dict:
    """The kernel_options each compiled FlexAttention key (scheme, device, dtype, head
    widths) ran with on `device` in this process (None: inductor's own): where the
    first ones overflowed the GPU's shared memory, the smaller ones that fitted
    (posenc.flex.call_fitting)."""
    from ..flex import _fitted

    return {
        " ".join(map(str, key)): options
        for key, options in _fitted.items()
        if torch.device(key[1]).type == device.type
    }


def _flex_options(device: torch.device) -> dict | None:
    from ..flex import flex_kernel_options

    return flex_kernel_options(device)
