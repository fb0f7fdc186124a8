"""Train short, test long: every scheme in one controlled study.

The same model, data, token budget and seeds for every scheme::

    # the committed results: 2 runs side by side on 2 cores, about two and a half
    # hours (posenc.study.extrapolation_budget.cpu_minutes)
    python -m posenc.study.extrapolation --preset cpu --fresh
    # then one run of each kind again, compared bit for bit with the stored rows
    python -m posenc.study.extrapolation --preset cpu --check rope/0 irope/0
    # a reader's GPU: six schemes, seed 0, the cpu preset's model (about 7 minutes
    # on a T4, estimated)
    python -m posenc.study.extrapolation --preset colab
    # a larger model on one GPU, and the same under DistributedDataParallel
    python -m posenc.study.extrapolation --preset gpu
    torchrun --nproc_per_node 2 -m posenc.study.extrapolation --preset gpu

Every scheme trains at length L on the bytes of the standard library
(posenc.study.corpus), with the passkey task of posenc.study.passkey mixed into every
step (the skill is learned at L); so do two layer recipes of today's models (RNoPE-SWA
and Llama 4's iRoPE). Each model is evaluated on the validation split at L, 2L, 4L and
8L with two protocols that score the same target bytes at every length
(posenc.study.evaluate: `matched` and `sliding`), on passkey retrieval at every length
and depth, and on a copy probe whose earlier copy lies up to 7.5L back
(posenc.study.longcontext). The model trained with plain RoPE is then extended to 4L by
fine-tuning on language-model data only (no passkey), with position interpolation,
NTK-aware scaling, YaRN with and without its temperature, and plain RoPE as the
control, the same steps each; a YaRN at factor 8, fine-tuned at 4L, tests extension
beyond the fine-tuning length, and the same text-only fine-tune at L (no rescaling)
shows what the fine-tune alone does. Each trained model also records where its heads
attend (`attention_profile`); a preset's variations (`Variation`: 8 heads, another
learning rate, ALiBi's slopes) train more models that change one thing, and its
ablations (`Ablation`) evaluate the RoPE weights another way, read from the weight
cache (posenc.study.extrapolation_weights; --weights) without training again. The byte
n-gram baselines (add-k, and interpolated Witten-Bell up to order 6) are scored on
exactly the target bytes of each protocol. Results go to a tidy CSV (a row per
measured number), a CSV of per-sequence values (for the bootstrap of
posenc.study.summary) and a JSON of metadata, in posenc.study.results.results_dir()
unless --out says otherwise; finished runs are skipped when the study is run again
(pass --fresh to start over).

The presets are in posenc.study.extrapolation_presets (their time in
extrapolation_budget), the models of each run in extrapolation_layers, one run in
extrapolation_runs (its scoring in extrapolation_eval); this module runs a study, writes
its files, checks stored runs and is the command line. Their public names are importable
from here as well.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from .corpus import load_corpus
from .extrapolation_budget import STEP_COSTS, StepCost, estimate, run_counts
from .extrapolation_check import check, now, pooled, result_paths
from .extrapolation_eval import Evaluation, attention_profile
from .extrapolation_layers import (
    CONTROL_AT_L,
    RECIPES,
    parameter_counts,
    rescalings,
    scheme_table,
    with_rope,
)
from .extrapolation_presets import (
    PRESETS,
    SCHEMES,
    Ablation,
    Preset,
    Variation,
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
)
from .extrapolation_weights import WeightCache
from .ngram import target_baselines
from .results import append_rows, progress, results_dir, sort_rows
from .runinfo import load_average, run_metadata

__all__ = [  # the study's public names, re-exported from its modules
    "COLUMNS", "CONTROL_AT_L", "PRESETS", "RECIPES", "SCHEMES", "SEQUENCE_COLUMNS",
    "STEP_COSTS", "Ablation", "Evaluation", "Preset", "StepCost", "Variation",
    "WeightCache", "World", "attention_profile", "build_model", "check", "estimate",
    "finished_runs", "join_world", "lm_batch", "main", "parameter_counts",
    "rescalings", "result_paths", "run", "run_counts", "scheme_table", "study", "tiny",
    "train_model", "with_rope",
]  # fmt: skip


# --- the study: runs, resume, files
# ---------------------------------------------------------------


def finished_runs(csv_path: Path) -> set[tuple[str, int]]:
    if not csv_path.exists():
        return set()
    with csv_path.open() as f:
        return {(r["run"], int(r["seed"])) for r in csv.DictReader(f)}


def _write(path: Path, meta: dict) -> None:
    """The metadata, keeping reproduction checks another process wrote meanwhile."""
    if path.exists():
        checks = json.loads(path.read_text()).get("reproduction_checks")
        if checks is not None:
            meta["reproduction_checks"] = checks
    path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def study(
    preset: Preset,
    out_dir: Path,
    labels=None,
    fresh: bool = False,
    quiet: bool = False,
    corpus_root: Path | None = None,
    weights: WeightCache | None = None,
) -> tuple[Path, Path, Path]:
    """Run every (run, seed) not already in the results file; write the CSVs and the
    metadata JSON.

    `labels` defaults to the preset's schemes (all of them where it names none); the
    runs are theirs and those of the preset's variations and ablations on them
    (`Preset.runs`). `weights` keeps every trained model (an ablation reads the RoPE
    run's from it); without it an ablation trains its RoPE run again. Under torchrun
    every process trains and evaluates its share; the first one writes the files.
    Otherwise `preset.jobs` processes train whole runs side by side (each run's numbers
    are the same as alone: a run depends on its preset and seed only, at a fixed thread
    count).
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
    if weights is not None:
        weights.key(preset)  # the source digest, fixed now for every process
    # another standard library's sources (posenc.study.gpu --corpus): the stored bytes
    corpus = load_corpus(preset.corpus_bytes, root=corpus_root)
    todo = None
    if world.main:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        if fresh:
            for path in (csv_path, seq_path, json_path):
                path.unlink(missing_ok=True)
        done = finished_runs(csv_path)
        # plain RoPE first: its context extensions are the longest runs, and the first
        # to look at; the ablations on its weights last
        runs = [
            (name, seed)
            for name, seed in preset.runs
            if name.partition(":")[0] in labels and (name, seed) not in done
        ]
        todo = sorted(runs, key=lambda r: (bool(preset.ablation(r[0])), r[0] != "rope"))
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
            # optimizer steps and evaluations of each run (extrapolation_budget)
            run_counts={name: run_counts(preset, name) for name, _ in preset.runs},
        )
        if "ngram_interpolated" not in meta:
            start = time.perf_counter()
            # the same bytes the models are scored on: per sequence of each protocol,
            # paired with the models' own
            targets = Evaluation(corpus, preset, World()).targets
            meta.update(target_baselines(corpus.train, corpus.valid, targets))
            meta["ngram_seconds"] = round(time.perf_counter() - start, 2)
        meta.setdefault("wall_seconds", {})
        _write(json_path, meta)
    if world.size > 1:
        box = [todo]
        dist.broadcast_object_list(box, src=0)
        todo = box[0]

    stored = []

    def store(label: str, seed: int, rows, seqs, seconds: float) -> None:
        stored.append((label, seed))
        meta["wall_seconds"][f"{label}/{seed}"] = round(seconds, 2)
        append_rows(seq_path, SEQUENCE_COLUMNS, [{"run": label, **s} for s in seqs])
        append_rows(
            csv_path, ["run"] + COLUMNS, [{"run": label, **r} for r in rows]
        )  # last: a run is done once it is here
        _write(json_path, meta)
        if not quiet:
            progress(len(stored), len(todo), f"{label}/{seed}")

    if preset.jobs > 1 and world.size == 1 and len(todo) > 1:
        pooled(preset, todo, corpus_root, weights, store)
    else:
        evaluation = Evaluation(corpus, preset, world)
        for label, seed in todo:
            start = time.perf_counter()
            rows, seqs = run(
                label, seed, preset, corpus, evaluation, world, device, weights
            )
            if world.main:
                store(label, seed, rows, seqs, time.perf_counter() - start)
    if world.main:
        rank = {
            name: i
            for i, name in enumerate(dict.fromkeys(name for name, _ in preset.runs))
        }
        for path in (csv_path, seq_path):
            # in the order of the preset's runs and the seeds, however they finished
            sort_rows(path, lambda r: (rank.get(r["run"], len(rank)), int(r["seed"])))
        meta["load_average_end"] = load_average()
        meta["date_end"] = now()
        _write(json_path, meta)
    return csv_path, seq_path, json_path


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
        nargs="+",
        metavar="RUN/SEED",
        help="re-run stored runs (e.g. rope/0 alibi:slopes_L/0 rope:temperature/0) and "
        "compare them with the stored rows, bit for bit",
    )
    parser.add_argument(
        "--weights",
        type=Path,
        help="the weight cache, outside the repository (default: $POSENC_WEIGHTS, "
        "else ~/.cache/posenc/extrapolation)",
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
    try:
        weights = WeightCache(args.weights)
    except ValueError as exc:
        parser.error(str(exc))
    if args.check:
        outcomes = check(preset, args.out, args.check, weights)
        for outcome in outcomes:
            print(json.dumps(outcome))
        return 0 if all(o["identical"] for o in outcomes) else 1
    paths = study(preset, args.out, args.schemes, args.fresh, weights=weights)
    if int(os.environ.get("RANK", "0")) == 0:
        print("wrote " + ", ".join(map(str, paths)))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
