"""Train short, test long: every scheme in one controlled study (same model, data, token budget, seeds).

    python -m posenc.study.extrapolation --preset cpu      # the whole study, single-threaded, on a CPU
    python -m posenc.study.extrapolation --preset gpu      # a larger model and length, on one GPU

Two tasks: byte-level language modelling on the standard library's sources
(posenc.study.corpus) and passkey retrieval (posenc.study.passkey). Every scheme is trained
at length L and evaluated at L, 2L, 4L and 8L. The RoPE rescalings (linear
interpolation, NTK-aware, YaRN) are applied to the model trained with plain RoPE,
zero-shot and after a short fine-tune at the longer length; plain RoPE gets the
same fine-tune as the control. Results go to one tidy CSV (a row per measured
number) and a JSON of metadata; finished runs are skipped when the study is run
again (delete the files, or pass --fresh, to start over).
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime as dt
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .corpus import VOCAB_SIZE, load_corpus, eval_windows, sample_windows
from ..model import TinyTransformer, train
from .passkey import passkey_accuracy, training_batches
from .runinfo import load_average, run_metadata
from ..qk.rope import Rope

TASKS = ("lm", "passkey")
COLUMNS = ["preset", "task", "scheme", "variant", "seed", "eval_len", "depth", "bucket", "metric", "value", "note"]


@dataclass(frozen=True)
class Preset:
    name: str
    dim: int
    num_heads: int
    num_layers: int
    train_len: int
    steps: int
    batch_size: int
    lr: float
    seeds: tuple[int, ...]
    corpus_bytes: int
    eval_count: int
    passkey_dim: int
    passkey_steps: int
    passkey_count: int
    passkey_lr: float = 1e-3  # retrieval (an induction circuit) forms at 1e-3 and not reliably at 3e-3
    finetune_factor: int = 4
    finetune_fraction: float = 0.1  # fine-tune steps as a fraction of the training steps
    eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    threads: int | None = None
    device: str = "cpu"

    @property
    def finetune_steps(self) -> int:
        return max(1, round(self.steps * self.finetune_fraction))

    @property
    def passkey_finetune_steps(self) -> int:
        return max(1, round(self.passkey_steps * self.finetune_fraction))


PRESETS = {
    # seconds: the tests and the chapter's live slice
    "smoke": Preset("smoke", dim=32, num_heads=4, num_layers=2, train_len=16, steps=20, batch_size=8, lr=3e-3, seeds=(0,),
                    corpus_bytes=1_000_000, eval_count=4, passkey_dim=32, passkey_steps=20, passkey_count=8, eval_factors=(1, 2), depths=(0.0, 1.0), threads=1),
    # the whole study in minutes on a 2-core CPU, one thread
    "cpu": Preset("cpu", dim=32, num_heads=4, num_layers=2, train_len=32, steps=300, batch_size=32, lr=3e-3, seeds=(0, 1),
                  corpus_bytes=4_000_000, eval_count=64, passkey_dim=64, passkey_steps=1600, passkey_count=64, threads=1),
    # a larger model and length on one GPU
    "gpu": Preset("gpu", dim=256, num_heads=8, num_layers=4, train_len=256, steps=2000, batch_size=64, lr=1e-3, seeds=(0, 1, 2),
                  corpus_bytes=20_000_000, eval_count=256, passkey_dim=256, passkey_steps=3000, passkey_count=256, device="cuda"),
}


def scheme_table(preset: Preset) -> dict[str, tuple[str, dict]]:
    """Label -> (registry name, arguments) of every scheme trained from scratch."""
    length = preset.train_len
    window = max(2, length // 4)
    return {
        "nope": ("nope", {}),
        "sinusoidal": ("sinusoidal", {}),
        "learned": ("learned", {}),
        "shaw": ("shaw", {"max_distance": max(1, length // 4)}),
        "t5": ("t5", {"num_buckets": 16, "max_distance": length}),
        "rope": ("rope", {}),
        "alibi": ("alibi", {}),
        "window_rope": ("sliding_window", {"window": window, "inner": "rope"}),
        "window_nope": ("sliding_window", {"window": window}),
    }


def rescalings(preset: Preset) -> dict[str, dict]:
    """Label -> Rope arguments of the rescalings applied to the model trained with plain RoPE."""
    s = preset.finetune_factor
    return {
        "rope_pi": {"rope_type": "linear", "factor": float(s)},
        "rope_ntk": {"rope_type": "ntk", "factor": float(s)},
        "rope_yarn": {"rope_type": "yarn", "factor": float(s), "original_max_position_embeddings": preset.train_len},
    }


def with_rope(model: TinyTransformer, **rope_args) -> TinyTransformer:
    """A copy of a RoPE model whose every layer uses a rescaled RoPE (the weights are shared by value)."""
    twin = copy.deepcopy(model)
    for block in twin.blocks:
        block.scheme = Rope(block.scheme.head_dim, **rope_args).to(next(twin.parameters()).device)
    return twin


# --- one run: a task, a scheme, a seed ---------------------------------------------------------

def _lm_batches(corpus, length: int, batch_size: int, seed: int, device):
    def batches(step: int):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        x, y = sample_windows(corpus.train, length, batch_size, gen)
        return x.to(device), y.to(device)

    return batches


def _passkey_batches(length: int, batch_size: int, seed: int, device):
    make = training_batches(length, batch_size, seed)

    def batches(step: int):
        x, y = make(step)
        return x.to(device), y.to(device)

    return batches


@torch.no_grad()
def lm_rows(model, corpus, preset: Preset) -> list[dict]:
    """Mean validation loss at every evaluation length, overall and per position bucket of width L."""
    model.eval()
    rows, device = [], next(model.parameters()).device
    for factor in preset.eval_factors:
        length = factor * preset.train_len
        x, y = eval_windows(corpus.valid, length, preset.eval_count)
        try:
            losses = []
            for chunk in range(0, len(x), 16):
                logits = model(x[chunk : chunk + 16].to(device))
                losses.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), y[chunk : chunk + 16].to(device), reduction="none").cpu())
        except ValueError as exc:  # a learned table has no row past its length
            rows.append({"eval_len": length, "bucket": "all", "metric": "loss", "value": math.nan, "note": str(exc).split(":")[0]})
            continue
        per_position = torch.cat(losses).double().mean(0)
        rows.append({"eval_len": length, "bucket": "all", "metric": "loss", "value": float(per_position.mean())})
        for b in range(factor):
            span = per_position[b * preset.train_len : (b + 1) * preset.train_len]
            rows.append({"eval_len": length, "bucket": f"{b * preset.train_len}-{(b + 1) * preset.train_len}", "metric": "loss", "value": float(span.mean())})
    return rows


def passkey_rows(model, preset: Preset) -> list[dict]:
    rows = []
    for factor in preset.eval_factors:
        length = factor * preset.train_len
        for depth in preset.depths:
            try:
                acc = passkey_accuracy(model, length, depth, count=preset.passkey_count)
                rows.append({"eval_len": length, "depth": depth, "metric": "exact_match", "value": acc})
            except ValueError as exc:
                rows.append({"eval_len": length, "depth": depth, "metric": "exact_match", "value": math.nan, "note": str(exc).split(":")[0]})
    return rows


def run(task: str, label: str, seed: int, preset: Preset, corpus=None) -> list[dict]:
    """Train one scheme on one task with one seed, evaluate it (and, for plain RoPE, its rescalings) at every length."""
    device = torch.device(preset.device)
    name, args = scheme_table(preset)[label]
    dim, steps, lr = (preset.dim, preset.steps, preset.lr) if task == "lm" else (preset.passkey_dim, preset.passkey_steps, preset.passkey_lr)
    torch.manual_seed(seed)
    model = TinyTransformer(VOCAB_SIZE, dim=dim, num_heads=preset.num_heads, num_layers=preset.num_layers, scheme=name,
                            scheme_args=args, max_len=preset.train_len).to(device)
    long_len = preset.finetune_factor * preset.train_len
    if task == "lm":
        batches, long_batches, evaluate = (_lm_batches(corpus, preset.train_len, preset.batch_size, seed, device),
                                           _lm_batches(corpus, long_len, max(1, preset.batch_size // preset.finetune_factor), seed + 7919, device),
                                           lambda m: lm_rows(m, corpus, preset))
        finetune_steps = preset.finetune_steps
    else:
        batches, long_batches, evaluate = (_passkey_batches(preset.train_len, preset.batch_size, seed, device),
                                           _passkey_batches(long_len, max(1, preset.batch_size // preset.finetune_factor), seed + 7919, device),
                                           lambda m: passkey_rows(m, preset))
        finetune_steps = preset.passkey_finetune_steps
    train(model, batches, steps, lr=lr)
    rows = [{"scheme": label, "variant": "trained", **r} for r in evaluate(model)]
    if label == "rope":
        variants = {"rope": {}, **rescalings(preset)}
        for variant_label, rope_args in variants.items():
            twin = with_rope(model, **rope_args)
            if variant_label != "rope":
                rows += [{"scheme": variant_label, "variant": "zero-shot", **r} for r in evaluate(twin)]
            train(twin, long_batches, finetune_steps, lr=lr)
            rows += [{"scheme": variant_label, "variant": "fine-tuned", **r} for r in evaluate(twin)]
    return [{"preset": preset.name, "task": task, "seed": seed, "depth": "", "bucket": "", "note": "", **r} for r in rows]


# --- the study: runs, resume, files ---------------------------------------------------------------

def finished_runs(csv_path: Path) -> set[tuple[str, str, int]]:
    if not csv_path.exists():
        return set()
    with csv_path.open() as f:
        return {(r["task"], r["run"], int(r["seed"])) for r in csv.DictReader(f)}


def progress(done: int, total: int, text: str) -> None:
    width = 30
    filled = round(width * done / total) if total else width
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {text:<40}", end="" if done < total else "\n", file=sys.stderr, flush=True)


def study(preset: Preset, out_dir: Path, tasks=TASKS, labels=None, fresh: bool = False, quiet: bool = False) -> tuple[Path, Path]:
    """Run every (task, scheme, seed) not already in the results file; write the CSV and the metadata JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / f"extrapolation_{preset.name}.csv", out_dir / f"extrapolation_{preset.name}.json"
    if fresh:
        csv_path.unlink(missing_ok=True)
        json_path.unlink(missing_ok=True)
    if preset.threads:
        torch.set_num_threads(preset.threads)
    labels = list(scheme_table(preset)) if labels is None else list(labels)
    unknown = sorted(set(labels) - set(scheme_table(preset)))
    if unknown:
        raise ValueError(f"unknown schemes {unknown}; choose from {sorted(scheme_table(preset))}")
    corpus = load_corpus(preset.corpus_bytes)
    meta = json.loads(json_path.read_text()) if json_path.exists() else {}
    meta.update(run_metadata(preset.name, preset, preset.device, torch.float32), **corpus.describe())
    meta.setdefault("wall_seconds", {})
    done = finished_runs(csv_path)
    todo = [(t, label, seed) for t in tasks for label in labels for seed in preset.seeds if (t, label, seed) not in done]
    new_file = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run"] + COLUMNS)
        if new_file:
            writer.writeheader()
        for i, (task, label, seed) in enumerate(todo):
            if not quiet:
                progress(i, len(todo), f"{task} {label} seed={seed}")
            start = time.perf_counter()
            rows = run(task, label, seed, preset, corpus)
            meta["wall_seconds"][f"{task}/{label}/{seed}"] = round(time.perf_counter() - start, 2)
            writer.writerows({"run": label, **{k: r.get(k, "") for k in COLUMNS}} for r in rows)
            f.flush()
            json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        if not quiet:
            progress(len(todo), len(todo), "done")
    meta["load_average_end"] = load_average()
    json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return csv_path, json_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.study.extrapolation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--out", type=Path, default=Path("chapters/results"), help="folder for the CSV and JSON (default: chapters/results)")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--schemes", nargs="+", help="a subset of the schemes (default: all)")
    parser.add_argument("--device", help="override the preset's device (cpu, cuda)")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results of this preset instead of resuming")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset] if args.device is None else replace(PRESETS[args.preset], device=args.device)
    if preset.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"preset {preset.name!r} runs on {preset.device}, but no GPU is available (try --preset cpu)")
    csv_path, json_path = study(preset, args.out, args.tasks, args.schemes, args.fresh)
    print(f"wrote {csv_path} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
