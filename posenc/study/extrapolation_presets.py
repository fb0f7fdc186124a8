"""The extrapolation study's presets: what a study trains, evaluates and varies.

A `Preset` fixes everything that decides a number (model, data, steps, evaluation,
seeds) except the device; its `Variation`s train more models that change one thing (the
head count, the learning rate, ALiBi's slopes), its `Ablation`s evaluate the kept RoPE
weights another way. What each run's model is (`scheme_table`, the layer recipes,
`rescalings`) is in posenc.study.extrapolation_layers, the time a preset takes in
extrapolation_budget. `tiny` shrinks a preset to the smoke preset's sizes for the tests
and the chapter's emulated GPU.
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
    "rnope_swa",
    "irope",
)  # the labels of scheme_table; the last two are layer recipes (extrapolation_layers)


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
    alibi_slopes: tuple[float, ...] | None = None  # ALiBi's slopes, one per head

    def __post_init__(self):
        object.__setattr__(self, "schemes", tuple(self.schemes))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if self.alibi_slopes is not None:
            object.__setattr__(self, "alibi_slopes", tuple(self.alibi_slopes))
            if set(self.schemes) != {"alibi"}:
                raise ValueError(
                    f"variation {self.name!r} sets ALiBi's slopes: its schemes must be "
                    f"('alibi',), got {list(self.schemes)}"
                )
        unknown = sorted(set(self.schemes) - set(SCHEMES))
        if unknown or not self.schemes:
            raise ValueError(
                f"variation {self.name!r}: schemes must be some of {sorted(SCHEMES)}, "
                f"got {list(self.schemes)}"
            )
        if not self.name.isidentifier() or self.changes == {}:
            raise ValueError(
                "a variation needs an identifier as its name and num_heads, lr or "
                f"alibi_slopes to change, got {self!r}"
            )

    @property
    def changes(self) -> dict:
        """The fields of the preset it changes, with their values."""
        fields = ("num_heads", "lr", "alibi_slopes")
        return {k: getattr(self, k) for k in fields if getattr(self, k) is not None}


@dataclass(frozen=True)
class Ablation:
    """An evaluation-only run set on the weights of the RoPE model and its fine-tunes
    (`name` one that extrapolation_layers.ablation_twins knows: "temperature"), for
    some seeds.

    Its runs are named "rope:name": they read the weights a study keeps in its weight
    cache (extrapolation_weights) and retrain nothing; without the cache they retrain
    the RoPE run first, with the same numbers.
    """

    name: str
    seeds: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if not self.name.isidentifier() or not self.seeds:
            raise ValueError(f"an ablation needs a name and seeds, got {self!r}")


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
    ablations: tuple[Ablation, ...] = ()  # evaluation-only run sets on RoPE's weights
    alibi_slopes: tuple[float, ...] | None = None  # None: the paper's, for num_heads
    probe_sequences: int = 0  # sequences of the copy probe (longcontext); 0: none

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
        object.__setattr__(
            self,
            "ablations",
            tuple(
                a if isinstance(a, Ablation) else Ablation(**a) for a in self.ablations
            ),
        )
        if self.alibi_slopes is not None:
            object.__setattr__(self, "alibi_slopes", tuple(self.alibi_slopes))
        changes = {}
        for v in (
            self.variations
        ):  # one name, one change: a name may come back with more schemes or seeds
            if changes.setdefault(v.name, v.changes) != v.changes:
                raise ValueError(
                    f"variations named {v.name!r} change different things: "
                    f"{changes[v.name]} and {v.changes}"
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
        variation's "scheme:name" runs, then each ablation's "rope:name" runs.
        """
        own = [(label, seed) for label in self.labels for seed in self.seeds]
        varied = [
            (f"{label}:{v.name}", seed)
            for v in self.variations
            for label in v.schemes
            for seed in v.seeds
        ]
        return (
            own
            + varied
            + [(f"rope:{a.name}", s) for a in self.ablations for s in a.seeds]
        )

    def ablation(self, run: str) -> Ablation | None:
        """The Ablation a run name belongs to ("rope:name"), None for a training run."""
        label, _, name = run.partition(":")
        found = [a for a in self.ablations if a.name == name]
        return found[0] if label == "rope" and found else None

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
        if self.ablation(run) is not None:
            return label, name, self
        variation = next((v for v in self.variations if v.name == name), None)
        if variation is None:
            raise ValueError(
                f"unknown variation {name!r} in run {run!r}; this preset has "
                f"{[v.name for v in self.variations]}"
            )
        return label, name, replace(self, **variation.changes, variations=())

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
        # what the results owe to two heads (section 8.1): 8 heads of 8, the same width
        # and weights (ALiBi's slopes 1/2 ... 1/256); NoPE, with no local prior, beside
        Variation("heads8", ("nope", "t5", "alibi"), (0, 1, 2), num_heads=8),
        # ALiBi's slopes apart from its head count: 2 heads with the slopes times 8 (at
        # distance L the bias is then Press et al.'s at their L = 512), and 8 heads with
        # the two slopes of 2 heads, four heads each
        Variation("slopes_L", ("alibi",), (0, 1, 2), alibi_slopes=(1 / 2, 1 / 32)),
        Variation(
            "heads8_two_slopes",
            ("alibi",),
            (0, 1, 2),
            num_heads=8,
            alibi_slopes=(1 / 16,) * 4 + (1 / 256,) * 4,
        ),
        # does the ranking hinge on the learning rate? half and twice the peak, two
        # schemes that rank apart past L
        Variation("lr_half", ("rope", "alibi"), (0,), lr=5e-3),
        Variation("lr_double", ("rope", "alibi"), (0,), lr=2e-2),
    ),
    # YaRN's temperature apart from its frequencies, on the kept RoPE weights
    ablations=(Ablation("temperature", (0, 1, 2, 3, 4)),),
    probe_sequences=32,
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
        probe_sequences=4,
    ),
    # the committed results: this 2-core machine, two runs side by side on one thread
    # each, about two and a half hours (extrapolation_budget.cpu_minutes)
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
        ablations=(),
    ),
    # one H100 (not yet run; its time by `estimate` under the stated "h100" StepCost):
    # 4 layers of width 256 (8 heads of 32), 3.3 M parameters, L = 256
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
        probe_sequences=128,
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
