"""One run of the extrapolation study: train a scheme with a seed, evaluate it at every
length, extend plain RoPE.

`World` is one process or the share of one under torchrun; `train_model` is the training
loop (the same updates for one process and several); `run` does one (scheme, seed),
scored by posenc.study.extrapolation_eval's `Evaluation`. The study over many runs,
its files and the command line are in posenc.study.extrapolation.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..model import TinyTransformer
from ..qk.rope import Rope
from .corpus import VOCAB_SIZE, sample_windows
from .extrapolation_eval import Evaluation
from .extrapolation_presets import CONTROL_AT_L, Preset, rescalings, scheme_table
from .passkey import training_batches
from .tasks import IGNORE_INDEX

COLUMNS = [
    "preset",
    "task",
    "scheme",
    "variant",
    "seed",
    "protocol",
    "eval_len",
    "depth",
    "bucket",
    "metric",
    "value",
    "note",
]
SEQUENCE_COLUMNS = [
    "run",
    "task",
    "scheme",
    "variant",
    "seed",
    "protocol",
    "eval_len",
    "depth",
    "values",
    "bucket",
]


def with_rope(model: TinyTransformer, **rope_args) -> TinyTransformer:
    """A copy of a RoPE model whose every layer uses a rescaled RoPE (the weights are
    copied by value).
    """
    twin = copy.deepcopy(model)
    for block in twin.blocks:
        block.scheme = Rope(block.scheme.head_dim, **rope_args).to(
            next(twin.parameters()).device
        )
    return twin


# --- processes: one, or several under torchrun
# -----------------------------------------------------


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def rows(self, n: int) -> slice:
        """This process's share of n rows (n must divide evenly: equal shares keep the
        mean of means exact).
        """
        if n % self.size:
            raise ValueError(
                f"a global batch of {n} rows does not split evenly over {self.size} "
                "processes"
            )
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
    """Join the process group when torchrun started several processes (NCCL on GPUs,
    gloo on CPUs).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(), torch.device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        return World(dist.get_rank(), dist.get_world_size()), torch.device(
            "cuda", local
        )
    return World(dist.get_rank(), dist.get_world_size()), torch.device(device)


# --- training
# ------------------------------------------------------------------------------------


def lm_batch(
    data: torch.Tensor, length: int, batch_size: int, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: random windows of the training split, deterministic
    per (seed, step).
    """
    gen = torch.Generator().manual_seed((seed << 22) + step)
    return sample_windows(data, length, batch_size, gen)


def train_model(
    model, steps: int, lr: float, warmup: int, batch, world: World, device
) -> list[float]:
    """AdamW with linear warm-up and cosine decay to lr/10; `batch(step)` returns
    [(inputs, targets, weight), ...] (global).

    The loss of a step is the sum over the groups of weight x mean cross-entropy of the
    group's targets. Under torchrun each process takes its equal share of every group's
    rows and DistributedDataParallel averages the gradients: the same update as one
    process (every row of a group has the same number of targets). Returns the loss of
    every step (of the global batch).
    """
    net = torch.nn.parallel.DistributedDataParallel(model) if world.size > 1 else model
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95)
    )
    schedule = lambda s: (
        min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))
    )  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses = []
    model.train()
    for step in range(steps):
        groups = [
            (x[world.rows(len(x))], y[world.rows(len(y))], w) for x, y, w in batch(step)
        ]
        sizes = [len(x) for x, _, _ in groups]
        logits = net(torch.cat([x for x, _, _ in groups]).to(device)).float()
        loss = 0.0
        for (x, y, w), part in zip(groups, logits.split(sizes)):
            loss = loss + w * F.cross_entropy(
                part.flatten(0, 1), y.to(device).flatten(), ignore_index=IGNORE_INDEX
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss = loss.detach()
        if (
            world.size > 1
        ):  # the global batch's loss: equal shares, so the mean over the processes
            dist.all_reduce(loss)
            loss /= world.size
        losses.append(loss.item())
    model.eval()
    return losses


# --- one run: a scheme and a seed
# -------------------------------------------------------------------


def build_model(label: str, preset: Preset, device) -> TinyTransformer:
    name, args = scheme_table(preset)[label]
    model = TinyTransformer(
        VOCAB_SIZE,
        dim=preset.dim,
        num_heads=preset.num_heads,
        num_layers=preset.num_layers,
        scheme=name,
        scheme_args=args,
        max_len=preset.train_len,
        backend="sdpa",
    )
    if any(
        block.scheme.needs_weights for block in model.blocks
    ):  # Shaw's value term needs the weights: explicit backend
        for block in model.blocks:
            block.backend = "explicit"
    return model.to(device)


def run(
    name: str,
    seed: int,
    preset: Preset,
    corpus,
    evaluation: Evaluation | None = None,
    world: World = World(),
    device=None,
) -> tuple[list[dict], list[dict]]:
    """Train one scheme (or a variation's "scheme:name") with one seed and evaluate it
    at every length.

    The model trained with plain RoPE (not a variation's) then goes on to its context
    extensions and to the control fine-tuned at L. A variation's preset differs only in
    what it changes; the evaluation sequences and tests are the preset's own.
    """
    device = torch.device(preset.device) if device is None else device
    evaluation = Evaluation(corpus, preset, world) if evaluation is None else evaluation
    label, variant, preset = preset.for_run(name)
    L = preset.train_len
    torch.manual_seed(seed)
    model = build_model(label, preset, device)
    make_passkey = training_batches(L, preset.passkey_batch, seed)

    def mixed(step):
        x, y = lm_batch(corpus.train, L, preset.batch_size, seed, step)
        px, py = make_passkey(step)
        return [(x, y, 1.0), (px, py, preset.passkey_weight)]

    losses = train_model(
        model, preset.steps, preset.lr, preset.warmup, mixed, world, device
    )
    rows, seqs = [], []

    def record(variant_label, variant, m, trained=False):
        r, s = evaluation(m, buckets=variant == "trained", attention=trained)
        rows.extend({"scheme": variant_label, "variant": variant, **x} for x in r)
        seqs.extend({"scheme": variant_label, "variant": variant, **x} for x in s)

    record(label, variant, model, trained=True)
    tail = losses[-max(1, preset.steps // 20) :]
    rows.append(
        {
            "task": "lm+passkey",
            "scheme": label,
            "variant": variant,
            "protocol": "train",
            "eval_len": L,
            "metric": "train_loss_end",
            "value": sum(tail) / len(tail),
        }
    )
    if label == "rope" and variant == "trained":

        def fine_tune(
            twin, length
        ):  # text only, the same bytes a step at every length: batch x length
            torch.manual_seed(seed)
            rows_ = max(1, preset.batch_size * L // length)
            train_model(
                twin,
                preset.finetune_steps,
                preset.finetune_lr,
                max(1, preset.warmup // 2),
                lambda step: [
                    (*lm_batch(corpus.train, length, rows_, seed + 512, step), 1.0)
                ],
                world,
                device,
            )

        for variant_label, rope_args in rescalings(preset).items():
            twin = with_rope(model, **rope_args)
            if rope_args:
                record(variant_label, "zero-shot", twin)
            fine_tune(twin, preset.finetune_factor * L)
            record(variant_label, "fine-tuned", twin)
        twin = with_rope(model)
        fine_tune(twin, L)
        record(CONTROL_AT_L, "fine-tuned", twin)
    full = [
        {
            "preset": preset.name,
            "seed": seed,
            "depth": "",
            "bucket": "",
            "note": "",
            **r,
        }
        for r in rows
    ]
    return full, [{"seed": seed, "depth": "", "bucket": "", **s} for s in seqs]
