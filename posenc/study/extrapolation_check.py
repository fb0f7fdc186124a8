"""Checking stored runs of the extrapolation study bit for bit, and the pool of
processes that runs a study's runs (and a check's) side by side.

`result_paths` names a preset's three result files; `pooled` runs (run, seed) pairs in
preset.jobs processes, an ablation's run only after the RoPE run of its seed; `check`
runs stored runs again and compares their rows and per-sequence values with the stored
ones, as the CSVs write them.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import multiprocessing
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch

from .corpus import load_corpus
from .extrapolation_eval import Evaluation
from .extrapolation_presets import Preset
from .extrapolation_runs import COLUMNS, SEQUENCE_COLUMNS, World, run
from .extrapolation_weights import WeightCache
from .runinfo import git_state


def result_paths(preset_name: str, out_dir: Path) -> tuple[Path, Path, Path]:
    return (
        out_dir / f"extrapolation_{preset_name}.csv",
        out_dir / f"extrapolation_{preset_name}_sequences.csv",
        out_dir / f"extrapolation_{preset_name}.json",
    )


_WORKER: dict = {}


def _start_worker(preset: Preset, corpus_root=None, weights=None) -> None:
    """A process of the pool: its threads, the corpus and the evaluation sequences,
    once.
    """
    if preset.threads:
        torch.set_num_threads(preset.threads)
    corpus = load_corpus(preset.corpus_bytes, root=corpus_root)
    evaluation = Evaluation(corpus, preset, World())
    _WORKER.update(preset=preset, corpus=corpus, evaluation=evaluation, weights=weights)


def _run_in_worker(label: str, seed: int) -> tuple:
    start = time.perf_counter()
    w = _WORKER
    rows, seqs = run(
        label, seed, w["preset"], w["corpus"], w["evaluation"], weights=w["weights"]
    )
    return label, seed, rows, seqs, time.perf_counter() - start


def pooled(preset: Preset, todo, corpus_root, weights, done) -> None:
    """Run `todo` in preset.jobs processes; `done(*result)` as each finishes. An
    ablation's run starts once the RoPE run of its seed (if in `todo`) is done."""
    waiting, unfinished, futures = list(todo), set(todo), {}
    parent = {r: ("rope", r[1]) for r in todo if preset.ablation(r[0])}
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        preset.jobs,
        mp_context=spawn,
        initializer=_start_worker,
        initargs=(preset, corpus_root, weights),
    ) as pool:
        while waiting or futures:
            for r in [r for r in waiting if parent.get(r) not in unfinished]:
                waiting.remove(r)
                futures[pool.submit(_run_in_worker, *r)] = r
            finished, _ = wait(futures, return_when=FIRST_COMPLETED)
            for future in finished:
                unfinished.discard(futures.pop(future))
                done(*future.result())


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def as_written(rows: list[dict], columns: list[str], label: str) -> list[dict]:
    """Rows as a CSV writes and reads them back (strings)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows({k: {"run": label, **r}.get(k, "") for k in columns} for r in rows)
    return list(csv.DictReader(io.StringIO(text.getvalue())))


def check(
    preset: Preset, out_dir: Path, runs, weights: WeightCache | None = None
) -> list[dict]:
    """Re-run stored runs ("scheme/seed" strings, or (run, seed) pairs) and compare
    their rows and per-sequence values with the stored ones, as the CSVs write them
    (bit for bit).

    preset.jobs of them run side by side. Each outcome is appended to the metadata JSON
    under "reproduction_checks" (one per run, the latest kept) and returned.
    """
    runs = [
        (r.partition("/")[0], int(r.partition("/")[2])) if isinstance(r, str) else r
        for r in ([runs] if isinstance(runs, str) else runs)
    ]
    csv_path, seq_path, json_path = result_paths(preset.name, Path(out_dir))
    stored = {}
    for path, key in ((csv_path, "rows"), (seq_path, "sequences")):
        with path.open() as f:
            for r in csv.DictReader(f):
                stored.setdefault((r["run"], int(r["seed"])), {}).setdefault(
                    key, []
                ).append(r)
    missing = [r for r in runs if r not in stored]
    if missing:
        raise ValueError(f"no stored rows for {missing} in {csv_path}")
    outcomes = []

    def compare(label, seed, rows, seqs, seconds) -> None:
        fresh = as_written(rows, ["run"] + COLUMNS, label)
        fresh_seqs = as_written(seqs, SEQUENCE_COLUMNS, label)
        old = stored[(label, seed)]
        differences = [
            abs(float(a["value"]) - float(b["value"]))
            for a, b in zip(old["rows"], fresh)
            if a["value"] != b["value"]
        ]
        outcomes.append(
            {
                "run": f"{label}/{seed}",
                "rows": len(old["rows"]),
                "sequence_rows": len(old.get("sequences", [])),
                "identical": fresh == old["rows"]
                and fresh_seqs == old.get("sequences", []),
                "max_abs_difference": max(
                    (d for d in differences if not math.isnan(d)), default=0.0
                ),
                "seconds": round(seconds, 1),
                "commit": git_state()[0],
                "threads": preset.threads or torch.get_num_threads(),
                "date": now(),
            }
        )

    if preset.jobs > 1 and len(runs) > 1:
        pooled(preset, runs, None, weights, compare)
    else:
        if preset.threads:
            torch.set_num_threads(preset.threads)
        corpus = load_corpus(preset.corpus_bytes)
        for label, seed in runs:
            start = time.perf_counter()
            rows, seqs = run(label, seed, preset, corpus, weights=weights)
            compare(label, seed, rows, seqs, time.perf_counter() - start)
    meta = json.loads(json_path.read_text())
    named = {o["run"] for o in outcomes}
    meta["reproduction_checks"] = [
        c for c in meta.get("reproduction_checks", []) if c["run"] not in named
    ] + outcomes
    json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return outcomes
