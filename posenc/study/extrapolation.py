"""Train short, test long: every scheme in one controlled study (same model, data, token budget, seeds).

    python -m posenc.study.extrapolation --preset cpu      # the committed results: 2 runs side by side on 2 cores, about 45 minutes
    python -m posenc.study.extrapolation --preset gpu      # a larger model on one GPU
    torchrun --nproc_per_node 2 -m posenc.study.extrapolation --preset gpu   # the same under DistributedDataParallel

Every scheme trains at length L on the bytes of the standard library (posenc.study.corpus),
with the passkey task of posenc.study.passkey mixed into every step (the skill is learned at
L). Each model is evaluated on the validation split at L, 2L, 4L and 8L with two protocols
that score the same target bytes at every length (posenc.study.evaluate: `matched` and
`sliding`), and on passkey retrieval at every length and depth. The model trained with plain
RoPE is then extended to 4L by fine-tuning on language-model data only (no passkey), with
position interpolation, NTK-aware scaling, YaRN, and plain RoPE as the control, the same steps
each; a YaRN at factor 8, fine-tuned at 4L, tests extension beyond the fine-tuning length.
Results go to a tidy CSV (a row per measured number), a CSV of per-sequence values (for the
bootstrap of posenc.study.summary) and a JSON of metadata; finished runs are skipped when the
study is run again (pass --fresh to start over).
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .results import results_dir
from ..model import TinyTransformer
from ..qk.rope import Rope
from .corpus import VOCAB_SIZE, load_corpus, sample_windows
from .evaluate import matched_losses, sliding_losses, spaced_sequences
from .ngram import ngram_baselines
from .passkey import passkey_correct, training_batches, test_batch
from .runinfo import git_state, load_average, run_metadata
from .tasks import IGNORE_INDEX

COLUMNS = ["preset", "task", "scheme", "variant", "seed", "protocol", "eval_len", "depth", "bucket", "metric", "value", "note"]
SEQUENCE_COLUMNS = ["run", "task", "scheme", "variant", "seed", "protocol", "eval_len", "depth", "values", "bucket"]


@dataclass(frozen=True)
class Preset:
    name: str
    dim: int
    num_heads: int
    num_layers: int
    train_len: int
    steps: int
    batch_size: int  # language-model windows per step (global: split over the processes)
    lr: float
    seeds: tuple[int, ...]
    eval_sequences: int  # matched protocol: sequences of 8L bytes
    sliding_sequences: int  # sliding protocol: sequences of L target bytes
    passkey_batch: int  # passkey sequences of length L mixed into every training step
    passkey_count: int  # test sequences per length and depth
    finetune_steps: int
    finetune_lr: float
    warmup: int = 50
    passkey_weight: float = 1.0  # the loss is LM loss + weight x passkey answer loss
    finetune_factor: int = 4
    beyond_factor: int = 8  # the rescaling tested past its fine-tuning length
    eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    sliding_stride_divisor: int = 2  # the window slides by L / divisor
    corpus_bytes: int | None = None  # None: the whole standard library
    threads: int | None = None  # torch threads of each process
    jobs: int = 1  # runs trained side by side in separate processes (one process, one run: the numbers do not depend on it)
    device: str = "cpu"

    @property
    def sliding_stride(self) -> int:
        return max(1, self.train_len // self.sliding_stride_divisor)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


PRESETS = {
    # seconds: the tests and the chapter's live slice
    "smoke": Preset("smoke", dim=32, num_heads=1, num_layers=1, train_len=16, steps=20, batch_size=8, lr=3e-3, seeds=(0,),
                    eval_sequences=8, sliding_sequences=8, passkey_batch=4, passkey_count=4, finetune_steps=4, finetune_lr=1e-3,
                    warmup=5, eval_factors=(1, 2, 4, 8), depths=(0.0, 1.0), corpus_bytes=1_000_000, threads=1),
    # the committed results: this 2-core machine, two runs side by side on one thread each, about 45 minutes
    "cpu": Preset("cpu", dim=64, num_heads=2, num_layers=4, train_len=64, steps=2500, batch_size=32, lr=1e-2, seeds=(0, 1, 2),
                  eval_sequences=128, sliding_sequences=128, passkey_batch=8, passkey_count=32, finetune_steps=200, finetune_lr=1e-3,
                  warmup=100, passkey_weight=0.25, threads=1, jobs=2),
    # one H100, about 10 minutes (not yet run): 4 layers of width 256 (8 heads of 32), 3.3 M parameters, L = 256
    "gpu": Preset("gpu", dim=256, num_heads=8, num_layers=4, train_len=256, steps=2000, batch_size=64, lr=1e-3, seeds=(0, 1, 2),
                  eval_sequences=512, sliding_sequences=512, passkey_batch=16, passkey_count=128, finetune_steps=400, finetune_lr=3e-4,
                  warmup=100, passkey_weight=0.25, device="cuda"),  # the cpu preset's passkey share and weight
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
    """Label -> Rope arguments of the context extensions of the model trained with plain RoPE ("rope": the control)."""
    s, beyond, original = float(preset.finetune_factor), float(preset.beyond_factor), preset.train_len
    return {
        "rope": {},
        "rope_pi": {"rope_type": "linear", "factor": s},
        "rope_ntk": {"rope_type": "ntk", "factor": s},
        "rope_yarn": {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": original},
        f"rope_yarn_x{preset.beyond_factor}": {"rope_type": "yarn", "factor": beyond, "original_max_position_embeddings": original},
    }


def with_rope(model: TinyTransformer, **rope_args) -> TinyTransformer:
    """A copy of a RoPE model whose every layer uses a rescaled RoPE (the weights are copied by value)."""
    twin = copy.deepcopy(model)
    for block in twin.blocks:
        block.scheme = Rope(block.scheme.head_dim, **rope_args).to(next(twin.parameters()).device)
    return twin


# --- processes: one, or several under torchrun -----------------------------------------------------

@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def rows(self, n: int) -> slice:
        """This process's share of n rows (n must divide evenly: equal shares keep the mean of means exact)."""
        if n % self.size:
            raise ValueError(f"a global batch of {n} rows does not split evenly over {self.size} processes")
        return slice(self.rank * n // self.size, (self.rank + 1) * n // self.size)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every process's rows, in rank order (row counts may differ)."""
        if self.size == 1:
            return tensor
        parts = [None] * self.size
        dist.all_gather_object(parts, tensor.cpu())
        return torch.cat(parts)

    def split(self, n: int) -> slice:
        """Contiguous, nearly equal shares of n evaluation rows."""
        return slice(self.rank * n // self.size, (self.rank + 1) * n // self.size)


def join_world(device: str) -> tuple[World, torch.device]:
    """Join the process group when torchrun started several processes (NCCL on GPUs, gloo on CPUs)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(), torch.device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        return World(dist.get_rank(), dist.get_world_size()), torch.device("cuda", local)
    return World(dist.get_rank(), dist.get_world_size()), torch.device(device)


# --- training ---------------------------------------------------------------------------------------

def lm_batch(data: torch.Tensor, length: int, batch_size: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: random windows of the training split, deterministic per (seed, step)."""
    gen = torch.Generator().manual_seed((seed << 22) + step)
    return sample_windows(data, length, batch_size, gen)


def train_model(model, steps: int, lr: float, warmup: int, batch, world: World, device) -> list[float]:
    """AdamW with linear warm-up and cosine decay to lr/10; `batch(step)` returns [(inputs, targets, weight), ...] (global).

    The loss of a step is the sum over the groups of weight x mean cross-entropy of the group's
    targets. Under torchrun each process takes its equal share of every group's rows and
    DistributedDataParallel averages the gradients: the same update as one process (every row of
    a group has the same number of targets). Returns the loss of every step (of the global batch).
    """
    net = torch.nn.parallel.DistributedDataParallel(model) if world.size > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses = []
    model.train()
    for step in range(steps):
        groups = [(x[world.rows(len(x))], y[world.rows(len(y))], w) for x, y, w in batch(step)]
        sizes = [len(x) for x, _, _ in groups]
        logits = net(torch.cat([x for x, _, _ in groups]).to(device)).float()
        loss = 0.0
        for (x, y, w), part in zip(groups, logits.split(sizes)):
            loss = loss + w * F.cross_entropy(part.flatten(0, 1), y.to(device).flatten(), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss = loss.detach()
        if world.size > 1:  # the global batch's loss: equal shares, so the mean over the processes
            dist.all_reduce(loss)
            loss /= world.size
        losses.append(loss.item())
    model.eval()
    return losses


# --- evaluation -----------------------------------------------------------------------------------

def _bucket(b: int, width: int) -> str:
    """The name of bucket b of positions: "64-128" for b = 1 at width 64."""
    return f"{b * width}-{(b + 1) * width}"


def _as_text(values: torch.Tensor) -> str:
    """Per-sequence losses as the sequences file stores them: space-separated, 4 decimals."""
    return " ".join(f"{v:.4f}" for v in values.tolist())


class Evaluation:
    """The fixed validation sequences and passkey tests of a preset, scored for one model at a time."""

    def __init__(self, corpus, preset: Preset, world: World):
        self.preset, self.world = preset, world
        L, longest = preset.train_len, max(preset.eval_factors) * preset.train_len
        self.matched = spaced_sequences(corpus.valid, longest + 1, preset.eval_sequences)
        # sliding: L targets after a context of the longest window, placed halfway between the matched sequences
        self.sliding = spaced_sequences(corpus.valid[longest // 2 :], longest + L + 1, preset.sliding_sequences)
        self.passkey_tests = {(f * L, d): test_batch(f * L, d, preset.passkey_count) for f in preset.eval_factors for d in preset.depths}

    def _mine(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.world.split(len(x))]

    def lm(self, model, buckets: bool = False) -> tuple[list[dict], list[dict]]:
        """(rows, per-sequence rows) of both protocols at every length.

        With `buckets`, the per-sequence rows also hold, at L and at the longest length, the mean
        loss of each bucket of L positions of every matched sequence (protocol "matched_bucket"):
        the pairs that posenc.study.summary.bucket_rise bootstraps.
        """
        p, L = self.preset, self.preset.train_len
        rows, seqs = [], []
        for factor in p.eval_factors:
            n = factor * L
            try:
                matched = self.world.gather(matched_losses(model, self._mine(self.matched), n))
                sliding = self.world.gather(sliding_losses(model, self._mine(self.sliding), n, L, p.sliding_stride))
            except ValueError as exc:  # a learned table has no row past its length
                note = str(exc).split(":")[0]
                rows += [{"protocol": proto, "eval_len": n, "bucket": "all", "metric": "loss", "value": math.nan, "note": note} for proto in ("matched", "sliding")]
                continue
            for proto, losses in (("matched", matched), ("sliding", sliding)):
                rows.append({"protocol": proto, "eval_len": n, "bucket": "all", "metric": "loss", "value": float(losses.mean())})
                seqs.append({"protocol": proto, "eval_len": n, "values": _as_text(losses.mean(1))})
            if buckets and factor in (1, max(p.eval_factors)):
                by_bucket = matched.reshape(len(matched), -1, L).mean(2)  # (sequences, buckets)
                seqs += [{"protocol": "matched_bucket", "eval_len": n, "bucket": _bucket(b, L), "values": _as_text(by_bucket[:, b])}
                         for b in range(by_bucket.shape[1])]
            per_position = matched.mean(0)
            for b in range(len(per_position) // L):
                rows.append({"protocol": "matched", "eval_len": n, "bucket": _bucket(b, L), "metric": "loss",
                             "value": float(per_position[b * L : (b + 1) * L].mean())})
        return rows, seqs

    def passkey(self, model) -> tuple[list[dict], list[dict]]:
        rows, seqs = [], []
        for (n, depth), (x, y) in self.passkey_tests.items():
            try:
                correct = self.world.gather(passkey_correct(model, self._mine(x), self._mine(y)))
            except ValueError as exc:
                rows.append({"protocol": "passkey", "eval_len": n, "depth": depth, "metric": "exact_match", "value": math.nan, "note": str(exc).split(":")[0]})
                continue
            rows.append({"protocol": "passkey", "eval_len": n, "depth": depth, "metric": "exact_match", "value": float(correct.double().mean())})
            seqs.append({"protocol": "passkey", "eval_len": n, "depth": depth, "values": "".join("1" if c else "0" for c in correct.tolist())})
        return rows, seqs

    def __call__(self, model, buckets: bool = False) -> tuple[list[dict], list[dict]]:
        lm_rows, lm_seqs = self.lm(model, buckets)
        pk_rows, pk_seqs = self.passkey(model)
        tag = lambda rows, task: [{"task": task, **r} for r in rows]  # noqa: E731
        return tag(lm_rows, "lm") + tag(pk_rows, "passkey"), tag(lm_seqs, "lm") + tag(pk_seqs, "passkey")


# --- one run: a scheme and a seed -------------------------------------------------------------------

def build_model(label: str, preset: Preset, device) -> TinyTransformer:
    name, args = scheme_table(preset)[label]
    model = TinyTransformer(VOCAB_SIZE, dim=preset.dim, num_heads=preset.num_heads, num_layers=preset.num_layers, scheme=name,
                            scheme_args=args, max_len=preset.train_len, backend="sdpa")
    if any(block.scheme.needs_weights for block in model.blocks):  # Shaw's value term needs the weights: explicit backend
        for block in model.blocks:
            block.backend = "explicit"
    return model.to(device)


def run(label: str, seed: int, preset: Preset, corpus, evaluation: Evaluation | None = None, world: World = World(), device=None) -> tuple[list[dict], list[dict]]:
    """Train one scheme with one seed, evaluate it (and, for plain RoPE, its context extensions) at every length."""
    device = torch.device(preset.device) if device is None else device
    evaluation = Evaluation(corpus, preset, world) if evaluation is None else evaluation
    L = preset.train_len
    torch.manual_seed(seed)
    model = build_model(label, preset, device)
    make_passkey = training_batches(L, preset.passkey_batch, seed)

    def mixed(step):
        x, y = lm_batch(corpus.train, L, preset.batch_size, seed, step)
        px, py = make_passkey(step)
        return [(x, y, 1.0), (px, py, preset.passkey_weight)]

    losses = train_model(model, preset.steps, preset.lr, preset.warmup, mixed, world, device)
    rows, seqs = [], []

    def record(variant_label, variant, m):
        r, s = evaluation(m, buckets=variant == "trained")
        rows.extend({"scheme": variant_label, "variant": variant, **x} for x in r)
        seqs.extend({"scheme": variant_label, "variant": variant, **x} for x in s)

    record(label, "trained", model)
    tail = losses[-max(1, preset.steps // 20) :]
    rows.append({"task": "lm+passkey", "scheme": label, "variant": "trained", "protocol": "train", "eval_len": L, "metric": "train_loss_end", "value": sum(tail) / len(tail)})
    if label == "rope":
        long_len = preset.finetune_factor * L
        long_batch = max(1, preset.batch_size // preset.finetune_factor)
        for variant_label, rope_args in rescalings(preset).items():
            twin = with_rope(model, **rope_args)
            if rope_args:
                record(variant_label, "zero-shot", twin)
            torch.manual_seed(seed)
            train_model(twin, preset.finetune_steps, preset.finetune_lr, max(1, preset.warmup // 2),
                        lambda step: [(*lm_batch(corpus.train, long_len, long_batch, seed + 512, step), 1.0)], world, device)
            record(variant_label, "fine-tuned", twin)
    full = [{"preset": preset.name, "seed": seed, "depth": "", "bucket": "", "note": "", **r} for r in rows]
    return full, [{"seed": seed, "depth": "", "bucket": "", **s} for s in seqs]


# --- the study: runs, resume, files ---------------------------------------------------------------

def result_paths(preset_name: str, out_dir: Path) -> tuple[Path, Path, Path]:
    return (out_dir / f"extrapolation_{preset_name}.csv", out_dir / f"extrapolation_{preset_name}_sequences.csv",
            out_dir / f"extrapolation_{preset_name}.json")


def finished_runs(csv_path: Path) -> set[tuple[str, int]]:
    if not csv_path.exists():
        return set()
    with csv_path.open() as f:
        return {(r["run"], int(r["seed"])) for r in csv.DictReader(f)}


def progress(done: int, total: int, text: str) -> None:
    width = 30
    filled = round(width * done / total) if total else width
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {text:<40}", end="" if done < total else "\n", file=sys.stderr, flush=True)


def _append(path: Path, columns: list[str], rows: list[dict]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows({k: r.get(k, "") for k in columns} for r in rows)


def _sort_rows(path: Path, key) -> None:
    if not path.exists():
        return
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns, rows = reader.fieldnames, list(reader)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(sorted(rows, key=key))  # stable: a run's rows keep their order


_WORKER: dict = {}


def _start_worker(preset: Preset) -> None:
    """A process of the pool: its threads, the corpus and the evaluation sequences, once."""
    if preset.threads:
        torch.set_num_threads(preset.threads)
    corpus = load_corpus(preset.corpus_bytes)
    _WORKER.update(preset=preset, corpus=corpus, evaluation=Evaluation(corpus, preset, World()))


def _run_in_worker(label: str, seed: int) -> tuple[str, int, list[dict], list[dict], float]:
    start = time.perf_counter()
    rows, seqs = run(label, seed, _WORKER["preset"], _WORKER["corpus"], _WORKER["evaluation"])
    return label, seed, rows, seqs, time.perf_counter() - start


def study(preset: Preset, out_dir: Path, labels=None, fresh: bool = False, quiet: bool = False) -> tuple[Path, Path, Path]:
    """Run every (scheme, seed) not already in the results file; write the CSVs and the metadata JSON.

    Under torchrun every process trains and evaluates its share; the first one writes the files.
    Otherwise `preset.jobs` processes train whole runs side by side (each run's numbers are the
    same as alone: a run depends on its preset and seed only, at a fixed thread count).
    """
    world, device = join_world(preset.device)
    csv_path, seq_path, json_path = result_paths(preset.name, Path(out_dir))
    labels = list(scheme_table(preset)) if labels is None else list(labels)
    unknown = sorted(set(labels) - set(scheme_table(preset)))
    if unknown:
        raise ValueError(f"unknown schemes {unknown}; choose from {sorted(scheme_table(preset))}")
    if preset.threads:
        torch.set_num_threads(preset.threads)
    corpus = load_corpus(preset.corpus_bytes)
    todo = None
    if world.main:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        if fresh:
            for path in (csv_path, seq_path, json_path):
                path.unlink(missing_ok=True)
        done = finished_runs(csv_path)
        # plain RoPE first: its context extensions are the longest runs, and the first to look at
        order = sorted(labels, key=lambda label: label != "rope")
        todo = [(label, seed) for label in order for seed in preset.seeds if (label, seed) not in done]
        meta = json.loads(json_path.read_text()) if json_path.exists() else {}
        meta.update(run_metadata(preset.name, preset, device, torch.float32), **corpus.describe())
        meta.update(seeds=list(preset.seeds), world_size=world.size, jobs=preset.jobs if world.size == 1 else 1, sliding_stride=preset.sliding_stride)
        if "ngram_baselines" not in meta:
            start = time.perf_counter()
            baselines = ngram_baselines(corpus.train, corpus.valid)
            meta["ngram_baselines"] = {k: v["loss"] for k, v in baselines.items()}
            meta["ngram_add_k"] = {k: v["k"] for k, v in baselines.items()}
            meta["ngram_seconds"] = round(time.perf_counter() - start, 2)
        meta.setdefault("wall_seconds", {})
        json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    if world.size > 1:
        box = [todo]
        dist.broadcast_object_list(box, src=0)
        todo = box[0]

    def store(label: str, seed: int, rows: list[dict], seqs: list[dict], seconds: float) -> None:
        meta["wall_seconds"][f"{label}/{seed}"] = round(seconds, 2)
        _append(seq_path, SEQUENCE_COLUMNS, [{"run": label, **s} for s in seqs])
        _append(csv_path, ["run"] + COLUMNS, [{"run": label, **r} for r in rows])  # last: a run is done once it is here
        json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")

    if preset.jobs > 1 and world.size == 1 and len(todo) > 1:  # runs side by side, one process each
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(preset.jobs, mp_context=spawn, initializer=_start_worker, initargs=(preset,)) as pool:
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
        rank = {label: i for i, label in enumerate(scheme_table(preset))}
        for path in (csv_path, seq_path):  # in the order of the scheme table and the seeds, however the runs finished
            _sort_rows(path, lambda r: (rank.get(r["run"], len(rank)), int(r["seed"])))
        meta["load_average_end"] = load_average()
        json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return csv_path, seq_path, json_path


def check(preset: Preset, out_dir: Path, label: str, seed: int) -> dict:
    """Re-run one stored (scheme, seed) and compare its rows with the stored ones, as the CSV writes them (bit for bit).

    The outcome is appended to the metadata JSON under "reproduction_checks" and returned.
    """
    csv_path, _, json_path = result_paths(preset.name, Path(out_dir))
    with csv_path.open() as f:
        stored = [r for r in csv.DictReader(f) if r["run"] == label and int(r["seed"]) == seed]
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
    differences = [abs(float(a["value"]) - float(b["value"])) for a, b in pairs if a["value"] != b["value"]]
    outcome = {"run": f"{label}/{seed}", "rows": len(stored), "identical": fresh == stored,
               "max_abs_difference": max((d for d in differences if d == d), default=0.0), "seconds": round(time.perf_counter() - start, 1),
               "commit": git_state()[0], "threads": torch.get_num_threads(), "date": run_metadata(preset.name, preset, "cpu", torch.float32)["date"]}
    meta = json.loads(json_path.read_text())
    meta["reproduction_checks"] = [c for c in meta.get("reproduction_checks", []) if c["run"] != outcome["run"]] + [outcome]
    json_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.study.extrapolation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--out", type=Path, default=results_dir(), help="folder for the results (default: posenc.study.results.results_dir(), here %(default)s)")
    parser.add_argument("--schemes", nargs="+", help="a subset of the schemes (default: all)")
    parser.add_argument("--device", help="override the preset's device (cpu, cuda)")
    parser.add_argument("--jobs", type=int, help="runs side by side, one process each (default: the preset's)")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results of this preset instead of resuming")
    parser.add_argument("--check", metavar="SCHEME/SEED", help="re-run one stored run and compare it with the stored rows, bit for bit")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset] if args.device is None else replace(PRESETS[args.preset], device=args.device)
    if args.jobs is not None:
        if args.jobs < 1:
            parser.error(f"--jobs must be a positive integer, got {args.jobs}")
        preset = replace(preset, jobs=args.jobs)
    if preset.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"preset {preset.name!r} runs on {preset.device}, but no GPU is available (try --preset cpu)")
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
