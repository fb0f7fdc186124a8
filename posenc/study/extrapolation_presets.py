"""The extrapolation study's presets, its schemes and context extensions, and the time a
preset will take on a GPU.

A `Preset` fixes everything that decides a number (model, data, steps, evaluation,
seeds) except the device; `scheme_table` and `rescalings` name the runs. `estimate`
counts a preset's optimizer steps and evaluations and turns them into seconds under a
stated `StepCost` (an assumption, never a measurement); given the metadata of the stored
`cpu` run it also sets the same runs' recorded CPU seconds beside the estimate. `tiny`
shrinks a preset to the smoke preset's sizes for the tests and the chapter's emulated
GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SCHEMES = (
    "nope",
    "sinusoidal",
    "learned",
    "shaw",
    "t5",
    "rope",
    "alibi",
    "window_rope",
    "window_nope",
)  # the labels of scheme_table


@dataclass(frozen=True)
class Variation:
    """A run set that changes one thing of its preset (the head count, the learning
    rate) for some schemes and seeds.

    Its runs are named "scheme:name" and train and evaluate like the preset's own (plain
    RoPE without its context extensions); their rows carry the variation's name as their
    variant.
    """

    name: str
    schemes: tuple[str, ...]
    seeds: tuple[int, ...]
    num_heads: int | None = None
    lr: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "schemes", tuple(self.schemes))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        unknown = sorted(set(self.schemes) - set(SCHEMES))
        if unknown or not self.schemes:
            raise ValueError(
                f"variation {self.name!r}: schemes must be some of {sorted(SCHEMES)}, "
                f"got {list(self.schemes)}"
            )
        if not self.name.isidentifier() or (self.num_heads, self.lr) == (None, None):
            raise ValueError(
                "a variation needs an identifier as its name and num_heads or lr to "
                f"change, got {self!r}"
            )


@dataclass(frozen=True)
class Preset:
    name: str
    dim: int
    num_heads: int
    num_layers: int
    train_len: int
    steps: int
    batch_size: (
        int  # language-model windows per step (global: split over the processes)
    )
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
    # runs trained side by side in separate processes (one process, one run: the numbers
    # do not depend on it)
    jobs: int = 1
    device: str = "cpu"
    schemes: tuple[str, ...] | None = (
        None  # the schemes a study trains; None: all of SCHEMES
    )
    variations: tuple[
        Variation, ...
    ] = ()  # run sets that change one thing (a stored preset gives them as dicts)

    def __post_init__(self):
        unknown = sorted(set(self.schemes or ()) - set(SCHEMES))
        if unknown:
            raise ValueError(
                f"unknown schemes {unknown}; choose from {sorted(SCHEMES)}"
            )
        object.__setattr__(
            self,
            "variations",
            tuple(
                v if isinstance(v, Variation) else Variation(**v)
                for v in self.variations
            ),
        )
        changes = {}
        for v in (
            self.variations
        ):  # one name, one change: a name may come back with more schemes or seeds
            if changes.setdefault(v.name, (v.num_heads, v.lr)) != (v.num_heads, v.lr):
                raise ValueError(
                    f"variations named {v.name!r} change different things: "
                    f"{changes[v.name]} and {(v.num_heads, v.lr)}"
                )
        runs = self.runs
        if len(set(runs)) < len(runs):
            raise ValueError(
                "a (run, seed) is listed twice in the variations of preset "
                f"{self.name!r}"
            )

    @property
    def runs(self) -> list[tuple[str, int]]:
        """Every (run, seed) of a study: the schemes with the preset's seeds, then each
        variation's "scheme:name" runs.
        """
        own = [(label, seed) for label in self.labels for seed in self.seeds]
        return own + [
            (f"{label}:{v.name}", seed)
            for v in self.variations
            for label in v.schemes
            for seed in v.seeds
        ]

    def for_run(self, run: str) -> tuple[str, str, Preset]:
        """(scheme label, variant, preset) of a run name: the variant is "trained" for
        the preset's own runs.
        """
        label, _, name = run.partition(":")
        if label not in SCHEMES:
            raise ValueError(
                f"unknown scheme {label!r} in run {run!r}; choose from "
                f"{sorted(SCHEMES)}"
            )
        if not name:
            return label, "trained", self
        variation = next((v for v in self.variations if v.name == name), None)
        if variation is None:
            raise ValueError(
                f"unknown variation {name!r} in run {run!r}; this preset has "
                f"{[v.name for v in self.variations]}"
            )
        changes = {
            k: getattr(variation, k)
            for k in ("num_heads", "lr")
            if getattr(variation, k) is not None
        }
        return label, name, replace(self, **changes, variations=())

    @property
    def sliding_stride(self) -> int:
        return max(1, self.train_len // self.sliding_stride_divisor)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def labels(self) -> tuple[str, ...]:
        """The schemes a study of this preset trains, in the scheme table's order."""
        return tuple(s for s in SCHEMES if self.schemes is None or s in self.schemes)


_CPU = Preset(
    "cpu",
    dim=64,
    num_heads=2,
    num_layers=4,
    train_len=64,
    steps=2500,
    batch_size=32,
    lr=1e-2,
    seeds=(0, 1, 2, 3, 4),
    eval_sequences=128,
    sliding_sequences=128,
    passkey_batch=8,
    passkey_count=32,
    finetune_steps=200,
    finetune_lr=1e-3,
    warmup=100,
    passkey_weight=0.25,
    threads=1,
    jobs=2,
    variations=(
        # what the results owe to two heads: 8 heads of 8, the same width and weights
        # (ALiBi's slopes 1/2 ... 1/256)
        Variation("heads8", SCHEMES, (0,), num_heads=8),
        Variation("heads8", ("t5", "alibi"), (1, 2), num_heads=8),
        # does the ranking hinge on the learning rate? half and twice the peak, two
        # schemes that rank apart past L
        Variation("lr_half", ("rope", "alibi"), (0,), lr=5e-3),
        Variation("lr_double", ("rope", "alibi"), (0,), lr=2e-2),
    ),
)
PRESETS = {
    # seconds: the tests and the chapter's live slice
    "smoke": Preset(
        "smoke",
        dim=32,
        num_heads=1,
        num_layers=1,
        train_len=16,
        steps=20,
        batch_size=8,
        lr=3e-3,
        seeds=(0,),
        eval_sequences=8,
        sliding_sequences=8,
        passkey_batch=4,
        passkey_count=4,
        finetune_steps=4,
        finetune_lr=1e-3,
        warmup=5,
        eval_factors=(1, 2, 4, 8),
        depths=(0.0, 1.0),
        corpus_bytes=1_000_000,
        threads=1,
    ),
    # the committed results: this 2-core machine, two runs side by side on one thread
    # each, about two hours (126 minutes for the stored run)
    "cpu": _CPU,
    # a reader's GPU (Colab's T4): the cpu preset's model, data, steps and evaluation,
    # six schemes, seed 0; about 7 minutes
    # on a T4 by `estimate` under the T4 StepCost (an assumption: not yet run on a GPU),
    # plotted beside the stored cpu run
    "colab": replace(
        _CPU,
        name="colab",
        seeds=(0,),
        threads=None,
        jobs=1,
        device="cuda",
        schemes=("nope", "sinusoidal", "t5", "rope", "alibi", "window_rope"),
        variations=(),
    ),
    # one H100, about 10 minutes (not yet run): 4 layers of width 256 (8 heads of 32),
    # 3.3 M parameters, L = 256
    "gpu": Preset(
        "gpu",
        dim=256,
        num_heads=8,
        num_layers=4,
        train_len=256,
        steps=2000,
        batch_size=64,
        lr=1e-3,
        seeds=(0, 1, 2),
        eval_sequences=512,
        sliding_sequences=512,
        passkey_batch=16,
        passkey_count=128,
        finetune_steps=400,
        finetune_lr=3e-4,
        warmup=100,
        passkey_weight=0.25,
        device="cuda",
    ),  # the cpu preset's passkey share and weight
}


def tiny(preset: Preset) -> Preset:
    """`preset` at the smoke preset's sizes (seconds on a CPU), with its device, schemes
    and first seed: tests and emulated GPUs.
    """
    return replace(
        PRESETS["smoke"],
        name=f"{preset.name}_tiny",
        device=preset.device,
        schemes=preset.schemes,
        seeds=preset.seeds[:1],
        threads=None,
    )


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


# plain RoPE fine-tuned like the extensions but at L: what the fine-tune alone does to
# the model
CONTROL_AT_L = "rope_at_L"


def rescalings(preset: Preset) -> dict[str, dict]:
    """Label -> Rope arguments of the context extensions of the model trained with plain
    RoPE ("rope": the control).
    """
    s, beyond, original = (
        float(preset.finetune_factor),
        float(preset.beyond_factor),
        preset.train_len,
    )
    return {
        "rope": {},
        "rope_pi": {"rope_type": "linear", "factor": s},
        "rope_ntk": {"rope_type": "ntk", "factor": s},
        "rope_yarn": {
            "rope_type": "yarn",
            "factor": s,
            "original_max_position_embeddings": original,
        },
        f"rope_yarn_x{preset.beyond_factor}": {
            "rope_type": "yarn",
            "factor": beyond,
            "original_max_position_embeddings": original,
        },
    }
