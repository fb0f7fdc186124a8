"""One run of the extrapolation study: train a scheme with a seed, evaluate it at every
length, extend plain RoPE; or evaluate kept RoPE weights another way (an ablation).

`World` is one process or the share of one under torchrun; `train_model` is the training
loop (the same updates for one process and several); `train_run` trains one (scheme,
seed) and, for plain RoPE, its fine-tuned extensions; `run` does one run, scored by
posenc.study.extrapolation_eval's `Evaluation`, and keeps its weights in a
posenc.study.extrapolation_weights.WeightCache when given one. The study over many
runs, its files and the command line are in posenc.study.extrapolation.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..model import TinyTransformer
from .corpus import VOCAB_SIZE, sample_windows
from .extrapolation_eval import Evaluation
from .extrapolation_layers import (
    CONTROL_AT_L,
    RECIPES,
    SlopedALiBi,
    ablation_twins,
    recipe_layers,
    rescalings,
    scheme_table,
    with_rope,
)
from .extrapolation_presets import Preset
from .extrapolation_weights import WeightCache
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
    """The model of a scheme (or a layer recipe) at the preset's sizes, on `device`;
    with the preset's `alibi_slopes` where it sets ALiBi's."""
    name, args = scheme_table(preset)[label]
    sizes = dict(dim=preset.dim, num_heads=preset.num_heads, backend="sdpa")
    if label in RECIPES:
        model = TinyTransformer(
            VOCAB_SIZE, scheme=recipe_layers(label, preset), **sizes
        )
    else:
        model = TinyTransformer(
            VOCAB_SIZE,
            num_layers=preset.num_layers,
            scheme=name,
            scheme_args=args,
            max_len=preset.train_len,
            **sizes,
        )
    if label == "alibi" and preset.alibi_slopes is not None:
        if len(preset.alibi_slopes) != preset.num_heads:
            raise ValueError(
                f"{len(preset.alibi_slopes)} ALiBi slopes for {preset.num_heads} heads"
            )
        sloped = SlopedALiBi(preset.alibi_slopes)  # no parameters: the same init
        model.input_scheme = sloped
        for block in model.blocks:
            block.scheme = sloped
    if any(
        block.scheme.needs_weights for block in model.blocks
    ):  # Shaw's value term needs the weights: explicit backend
        for block in model.blocks:
            block.backend = "explicit"
    return model.to(device)


def train_run(
    label: str, variant: str, seed: int, preset: Preset, corpus, world, device
) -> tuple[TinyTransformer, list[float], dict[str, TinyTransformer]]:
    """Train one scheme with one seed: (model, loss of every step, fine-tuned twins).

    The model trained with plain RoPE (variant "trained") goes on to its context
    extensions, each fine-tuned at 4L on text only, and to the control fine-tuned at L;
    the twins are keyed by their labels (rescalings, CONTROL_AT_L). Every fine-tune
    starts from the same seed, so the twins do not depend on their order.
    """
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
    twins = {}
    if label != "rope" or variant != "trained":
        return model, losses, twins

    def fine_tune(twin, length):
        # text only, the same bytes a step at every length: batch x length
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
        return twin

    for twin_label, rope_args in rescalings(preset).items():
        twins[twin_label] = fine_tune(
            with_rope(model, **rope_args), preset.finetune_factor * L
        )
    twins[CONTROL_AT_L] = fine_tune(with_rope(model), L)
    return model, losses, twins


def run(
    name: str,
    seed: int,
    preset: Preset,
    corpus,
    evaluation: Evaluation | None = None,
    world: World = World(),
    device=None,
    weights: WeightCache | None = None,
) -> tuple[list[dict], list[dict]]:
    """Train one scheme (or a variation's "scheme:name") with one seed and evaluate it
    at every length; or evaluate an ablation's "rope:name" on the RoPE run's weights.

    The model trained with plain RoPE (not a variation's) is evaluated zero-shot with
    each context extension, then after each fine-tune, then the control fine-tuned at
    L. A variation's preset differs only in what it changes; the evaluation sequences
    and tests are the preset's own. With `weights`, a trained run keeps its models
    there, and an ablation reads them (without, or where they are missing, it trains
    the RoPE run again: the same weights).
    """
    device = torch.device(preset.device) if device is None else device
    evaluation = Evaluation(corpus, preset, world) if evaluation is None else evaluation
    study_preset, ablation = preset, preset.ablation(name)
    label, variant, preset = preset.for_run(name)
    rows, seqs = [], []

    def record(variant_label, variant, m, trained=False):
        r, s = evaluation(m, buckets=variant == "trained", attention=trained)
        rows.extend({"scheme": variant_label, "variant": variant, **x} for x in r)
        seqs.extend({"scheme": variant_label, "variant": variant, **x} for x in s)

    if ablation is not None:
        states = rope_weights(seed, study_preset, corpus, world, device, weights)
        base = build_model("rope", study_preset, device)
        for twin in ablation_twins(ablation.name, study_preset):
            base.load_state_dict(states[twin.source])
            model = with_rope(base, twin.temperature, **twin.rope_args)
            record(twin.label, twin.variant, model)
    else:
        model, losses, twins = train_run(
            label, variant, seed, preset, corpus, world, device
        )
        if weights is not None and world.main:
            weights.save(study_preset, name, seed, {"trained": model, **twins})
        if world.size > 1:
            dist.barrier()  # an ablation may read them next, in any process
        record(label, variant, model, trained=True)
        tail = losses[-max(1, preset.steps // 20) :]
        rows.append(
            {
                "task": "lm+passkey",
                "scheme": label,
                "variant": variant,
                "protocol": "train",
                "eval_len": preset.train_len,
                "metric": "train_loss_end",
                "value": sum(tail) / len(tail),
            }
        )
        for twin_label, rope_args in rescalings(preset).items() if twins else ():
            if rope_args:
                record(twin_label, "zero-shot", with_rope(model, **rope_args))
            record(twin_label, "fine-tuned", twins[twin_label])
        if twins:
            record(CONTROL_AT_L, "fine-tuned", twins[CONTROL_AT_L])
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


def rope_weights(seed, preset, corpus, world, device, weights=None) -> dict:
    """Label -> state dict of the RoPE run of `seed` ("trained" and its fine-tuned
    twins): from `weights` where kept there, else trained again (and kept)."""
    states = None if weights is None else weights.load(preset, "rope", seed)
    if states is None:
        model, _, twins = train_run(
            "rope", "trained", seed, preset, corpus, world, device
        )
        models = {"trained": model, **twins}
        if weights is not None and world.main:
            weights.save(preset, "rope", seed, models)
        states = {k: m.state_dict() for k, m in models.items()}
    return states
