"""Train short, test long: every scheme in one controlled study.

The same model, data, token budget and seeds for every scheme::

    # the committed results: 2 runs side by side on 2 cores, about two hours
    python -m posenc.study.extrapolation --preset cpu
    # a reader's GPU: six schemes, seed 0, the cpu preset's model (about 7 minutes
    # on a T4, estimated)
    python -m posenc.study.extrapolation --preset colab
    # a larger model on one GPU, and the same under DistributedDataParallel
    python -m posenc.study.extrapolation --preset gpu
    torchrun --nproc_per_node 2 -m posenc.study.extrapolation --preset gpu

Every scheme trains at length L on the bytes of the standard library
(posenc.study.corpus), with the passkey task of posenc.study.passkey mixed into every
step (the skill is learned at L). Each model is evaluated on the validation split at L,
2L, 4L and 8L with two protocols that score the same target bytes at every length
(posenc.study.evaluate: `matched` and `sliding`), and on passkey retrieval at every
length and depth. The model trained with plain RoPE is then extended to 4L by
fine-tuning on language-model data only (no passkey), with position interpolation,
NTK-aware scaling, YaRN, and plain RoPE as the control, the same steps each; a YaRN at
factor 8, fine-tuned at 4L, tests extension beyond the fine-tuning length, and the same
text-only fine-tune at L (no rescaling) shows what the fine-tune alone does. Each
trained model also records where its heads attend (`attention_profile`), and a preset's
variations (`Variation`: 8 heads, another learning rate) train more models that change
one thing. The byte n-gram baselines are scored on exactly the target bytes of each
protocol. Results go to a tidy CSV (a row per measured number), a CSV of per-sequence
values (for the bootstrap of posenc.study.summary) and a JSON of metadata, in
posenc.study.results.results_dir() unless --out says otherwise; finished runs are
skipped when the study is run again (pass --fresh to start over).

The presets are in posenc.study.extrapolation_presets (their time in
extrapolation_budget), one run in posenc.study.extrapolation_runs (its scoring in
extrapolation_eval); this module runs a study, writes its files, checks a stored run
and is the command line. Their public names are importable from here as well.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from .corpus import load_corpus
from .extrapolation_budget import STEP_COSTS, StepCost, estimate, run_counts
from .extrapolation_eval import Evaluation, attention_profile
from .extrapolation_presets import (
    CONTROL_AT_L,
    PRESETS,
    SCHEMES,
    Preset,
    Variation,
    rescalings,
    scheme_table,
    tiny,
)
from .extrapolation_runs import (
    COLUMNS,
    SEQUENCE_COLUMNS,
    World,
    build_model,
    join_world,
    lm_batch,
    run,
    train_model,
    with_rope,
)
from .ngram import byte_losses, ngram_baselines
from .results import append_rows, progress, results_dir, sort_rows
from .runinfo import git_state, load_average, run_metadata

__all__ = [  # the study's public names, re-exported from its modules
    "COLUMNS", "CONTROL_AT_L", "PRESETS", "SCHEMES", "SEQUENCE_COLUMNS", "STEP_COSTS",
    "Evaluation", "Preset", "StepCost", "Variation", "World", "attention_profile",
    "build_model", "check", "estimate", "finished_runs", "join_world", "lm_batch",
    "main", "rescalings", "result_paths", "run", "run_counts", "scheme_table", "study",
    "tiny", "train_model", "with_rope",
]  # fmt: skip


# --- the study: runs, resume, files
# ---------------------------------------------------------------


def result_paths(preset_name: str, out_dir: Path) -> tuple[Path, Path, Path]:
    return (
        out_dir / f"extrapolation_{preset_name}.csv",
        out_dir / f"extrapolation_{preset_name}_sequences.csv",
        out_dir / f"extrapolation_{preset_name}.json",
    )


def finished_runs(csv_path: Path) -> set[tuple[str, int]]:
    if not csv_path.exists():
        return set()
    with csv_path.open() as f:
        return {(r["run"], int(r["seed"])) for r in csv.DictReader(f)}


_WORKER: dict = {}


def _start_worker(preset: Preset, corpus_root: Path | None = None) -> None:
    """A process of the pool: its threads, the corpus and the evaluation sequences,
    once.
    """
    if preset.threads:
        torch.set_num_threads(preset.threads)
    corpus = load_corpus(preset.corpus_bytes, root=corpus_root)
    _WORKER.update(
        preset=preset, corpus=corpus, evaluation=Evaluation(corpus, preset, World())
    )


def _run_in_worker(
    label: str, seed: int
) -> tuple[str, int, list[dict], list[dict], float]:
    start = time.perf_counter()
    rows, seqs = run(
        label, seed, _WORKER["preset"], _WORKER["corpus"], _WORKER["evaluation"]
    )
    return label, seed, rows, seqs, time.perf_counter() - start


def study(
    preset: Preset,
    out_dir: Path,
    labels=None,
    fresh: bool = False,
    quiet: bool = False,
    corpus_root: Path | None = None,
) -> tuple[Path, Path, Path]:
    """Run every (scheme, seed) not already in the results file; write the CSVs and the
    metadata JSON.

    `labels` defaults to the preset's schemes (all of them where it names none); the
    runs are theirs and those of the preset's variations on them (`Preset.runs`). Under
    torchrun every process trains and evaluates its share; the first one writes the
    files. Otherwise `preset.jobs` processes train whole runs side by side (each run's
    numbers are the same as alone: a run depends on its preset and seed only, at a fixed
    thread count). `corpus_root` reads the corpus from another standard library's
    sources (`python -m posenc.study.gpu --corpus`: the stored run's bytes on another
    Python); by default, the running Python's.
    """
    world, device = join_world(preset.device)
    csv_path, seq_path, json_path = result_paths(preset.name, Path(out_dir))
    labels = list(preset.labels) if labels is None else list(labels)
    unknown = sorted(set(labels) - set(scheme_table(preset)))
    if unknown:
        raise ValueError(
            f"unknown schemes {unknown}; choose from {sorted(scheme_table(preset))}"
        )
    if preset.threads:
        torch.set_num_threads(preset.threads)
    corpus = load_corpus(preset.corpus_bytes, root=corpus_root)
    todo = None
    if world.main:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        if fresh:
            for path in (csv_path, seq_path, json_path):
                path.unlink(missing_ok=True)
        done = finished_runs(csv_path)
        # plain RoPE first: its context extensions are the longest runs, and the first
        # to look at
        runs = [
            (name, seed)
            for name, seed in preset.runs
            if name.partition(":")[0] in labels and (name, seed) not in done
        ]
        todo = sorted(runs, key=lambda r: r[0] != "rope")
        meta = json.loads(json_path.read_text()) if json_path.exists() else {}
        meta.update(
            run_metadata(preset.name, preset, device, torch.float32),
            **corpus.describe(),
        )
        meta.update(
            seeds=list(preset.seeds),
            world_size=world.size,
            jobs=preset.jobs if world.size == 1 else 1,
            sliding_stride=preset.sliding_stride,
        )
        if "ngram_baselines" not in meta:
            start = time.perf_counter()
            baselines = ngram_baselines(corpus.train, corpus.valid)
            meta["ngram_baselines"] = {k: v["loss"] for k, v in baselines.items()}
            meta["ngram_add_k"] = {k: v["k"] for k, v in baselines.items()}
            # the same bytes the models are scored on: per sequence of each protocol,
            # paired with the models' own
            targets = Evaluation(corpus, preset, World()).targets
            per_byte = {
                k: byte_losses(corpus.train, corpus.valid, n, meta["ngram_add_k"][k])
                for n, k in ((2, "bigram"), (3, "trigram"), (4, "4gram"))
            }
            meta["ngram_targets"] = {
                proto: {
                    k: " ".join(f"{v:.4f}" for v in losses[at].mean(1).tolist())
                    for k, losses in per_byte.items()
                }
                for proto, at in targets.items()
            }
            meta["ngram_on_targets"] = {
                proto: {
                    k: round(float(losses[at].mean()), 4)
                    for k, losses in per_byte.items()
                }
                for proto, at in targets.items()
            }
            meta["ngram_seconds"] = round(time.perf_counter() - start, 2)
        meta.setdefault("wall_seconds", {})
        json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    if world.size > 1:
        box = [todo]
        dist.broadcast_object_list(box, src=0)
        todo = box[0]

    def store(
        label: str, seed: int, rows: list[dict], seqs: list[dict], seconds: float
    ) -> None:
        meta["wall_seconds"][f"{label}/{seed}"] = round(seconds, 2)
        append_rows(seq_path, SEQUENCE_COLUMNS, [{"run": label, **s} for s in seqs])
        append_rows(
            csv_path, ["run"] + COLUMNS, [{"run": label, **r} for r in rows]
        )  # last: a run is done once it is here
        json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")

    if (
        preset.jobs > 1 and world.size == 1 and len(todo) > 1
    ):  # runs side by side, one process each
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            preset.jobs,
            mp_context=spawn,
            initializer=_start_worker,
            initargs=(preset, corpus_root),
        ) as pool:
            futures = [pool.submit(_run_in_worker, label, seed) for label, seed in todo]
            for i, future in enumerate(as_completed(futures)):
                store(*future.result())
                if not quiet:
                    progress(i + 1, len(todo), "")
    else:
        evaluation = Evaluation(corpus, preset, world)
        for i, (label, seed) in enumerate(todo):
            if world.main and not quiet:
                progress(i, len(todo), f"{label} seed={seed}")
            start = time.perf_counter()
            rows, seqs = run(label, seed, preset, corpus, evaluation, world, device)
            if world.main:
                store(label, seed, rows, seqs, time.perf_counter() - start)
        if world.main and not quiet:
            progress(len(todo), len(todo), "done")
    if world.main:
        rank = {
            name: i
            for i, name in enumerate(dict.fromkeys(name for name, _ in preset.runs))
        }
        for path in (
            csv_path,
            seq_path,
        ):  # in the order of the preset's runs and the seeds, however the runs finished
            sort_rows(path, lambda r: (rank.get(r["run"], len(rank)), int(r["seed"])))
        meta["load_average_end"] = load_average()
        json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return csv_path, seq_path, json_path


def check(preset: Preset, out_dir: Path, label: str, seed: int) -> dict:
    """Re-run one stored (scheme, seed) and compare its rows with the stored ones, as
    the CSV writes them (bit for bit).

    The outcome is appended to the metadata JSON under "reproduction_checks" and
    returned.
    """
    csv_path, _, json_path = result_paths(preset.name, Path(out_dir))
    with csv_path.open() as f:
        stored = [
            r for r in csv.DictReader(f) if r["run"] == label and int(r["seed"]) == seed
        ]
    if not stored:
        raise ValueError(f"no stored rows for {label}/{seed} in {csv_path}")
    if preset.threads:
        torch.set_num_threads(preset.threads)
    start = time.perf_counter()
    rows, _ = run(label, seed, preset, load_corpus(preset.corpus_bytes))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=["run"] + COLUMNS)
    writer.writeheader()
    writer.writerows({"run": label, **{k: r.get(k, "") for k in COLUMNS}} for r in rows)
    fresh = list(csv.DictReader(io.StringIO(text.getvalue())))
    pairs = list(zip(stored, fresh))
    differences = [
        abs(float(a["value"]) - float(b["value"]))
        for a, b in pairs
        if a["value"] != b["value"]
    ]
    outcome = {
        "run": f"{label}/{seed}",
        "rows": len(stored),
        "identical": fresh == stored,
        "max_abs_difference": max((d for d in differences if d == d), default=0.0),
        "seconds": round(time.perf_counter() - start, 1),
        "commit": git_state()[0],
        "threads": torch.get_num_threads(),
        "date": run_metadata(preset.name, preset, "cpu", torch.float32)["date"],
    }
    meta = json.loads(json_path.read_text())
    meta["reproduction_checks"] = [
        c for c in meta.get("reproduction_checks", []) if c["run"] != outcome["run"]
    ] + [outcome]
    json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posenc.study.extrapolation",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument(
        "--out",
        type=Path,
        default=results_dir(),
        help="folder for the results (default: posenc.study.results.results_dir(), "
        "here %(default)s)",
    )
    parser.add_argument(
        "--schemes",
        nargs="+",
        help="a subset of the schemes (default: the preset's, all where it names none)",
    )
    parser.add_argument("--device", help="override the preset's device (cpu, cuda)")
    parser.add_argument(
        "--jobs",
        type=int,
        help="runs side by side, one process each (default: the preset's)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="discard earlier results of this preset instead of resuming",
    )
    parser.add_argument(
        "--check",
        metavar="SCHEME/SEED",
        help="re-run one stored run and compare it with the stored rows, bit for bit",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="the preset at the smoke preset's sizes, named PRESET_tiny: seconds, "
        "to try its code path",
    )
    args = parser.parse_args(argv)
    preset = tiny(PRESETS[args.preset]) if args.tiny else PRESETS[args.preset]
    preset = preset if args.device is None else replace(preset, device=args.device)
    if args.jobs is not None:
        if args.jobs < 1:
            parser.error(f"--jobs must be a positive integer, got {args.jobs}")
        preset = replace(preset, jobs=args.jobs)
    if preset.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(
            f"preset {preset.name!r} runs on {preset.device}, but no GPU is available "
            "(try --preset cpu)"
        )
    if args.check:
        label, _, seed = args.check.partition("/")
        outcome = check(preset, args.out, label, int(seed))
        print(json.dumps(outcome))
        return 0 if outcome["identical"] else 1
    paths = study(preset, args.out, args.schemes, args.fresh)
    if int(os.environ.get("RANK", "0")) == 0:
        print("wrote " + ", ".join(map(str, paths)))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
