"""What each run of the extrapolation study trains and evaluates: the schemes, two of
today's layer recipes, ALiBi's slopes, RoPE's context extensions and their temperature.

`scheme_table` names the models trained from scratch; `recipe_layers` builds the two
recipes (one posenc scheme per layer, as posenc.layer_schemes builds a real model's);
`SlopedALiBi` is ALiBi with slopes of the study's choosing; `rescalings` gives the
context extensions of the RoPE model, `with_rope` puts one into a copy of a model, and
`ablation_twins` lists the evaluation-only variants of an `Ablation`.
`parameter_counts` counts every model's parameters.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..layer import Layer, LogFloorTemperature
from ..qk.rope import Rope
from ..qk.rope_scaling import yarn_mscale
from ..scheme import NoPE, Scheme
from ..score.alibi import ALiBi
from ..score.masks import chunked, sliding_window
from .extrapolation_presets import Preset

RECIPES = ("rnope_swa", "irope")  # labels of scheme_table built by recipe_layers
# plain RoPE fine-tuned like the extensions but at L: what the fine-tune alone does to
# the model
CONTROL_AT_L = "rope_at_L"


def scheme_table(preset: Preset) -> dict[str, tuple[str, dict]]:
    """Label -> (registry name, arguments) of every model trained from scratch; a
    recipe's name is "layers" and its arguments are recipe_layers'.
    """
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
        "rnope_swa": ("layers", {"recipe": "rnope_swa", "size": window}),
        "irope": ("layers", {"recipe": "irope", "size": window}),
    }


def recipe_layers(label: str, preset: Preset) -> list[Scheme]:
    """One scheme per layer of a recipe: local RoPE layers, and every fourth layer
    (and the last) a global layer with no position.

    * "rnope_swa" (Yang et al.'s RNoPE-SWA; Cohere's Command R7B and Command A, three
      window layers to one full layer): RoPE inside a causal window of W = L/4 keys
      (the window_rope scheme's), the global layer NoPE over the whole context.
    * "irope" (Llama 4): RoPE inside chunks of C = L/4 positions, the global layer NoPE
      with Llama 4's query temperature 1 + 0.1 ln(1 + floor((p + 1) / C)); Llama 4
      steps it every floor_scale = attention_chunk_size = 8192 positions, here every C.
      Llama 4's L2 norm of the RoPE layers' queries and keys is left out.
    """
    if label not in RECIPES:
        raise ValueError(f"unknown recipe {label!r}; choose from {list(RECIPES)}")
    size = scheme_table(preset)[label][1]["size"]
    rope = Rope(preset.head_dim)
    if label == "rnope_swa":
        local, wide = Layer(rope, sliding_window(size)), NoPE()
    else:
        temperature = LogFloorTemperature(beta=0.1, step=size, offset=1.0)
        local, wide = Layer(rope, chunked(size)), Layer(temperature=temperature)
    last = preset.num_layers - 1
    return [
        wide if (i + 1) % 4 == 0 or i == last else local
        for i in range(preset.num_layers)
    ]


class SlopedALiBi(ALiBi):
    """ALiBi with the given slopes, one per head, instead of the paper's for the head
    count (fixed, as the paper's are)."""

    def __init__(self, slopes):
        slopes = torch.as_tensor(slopes, dtype=torch.float64)
        if slopes.ndim != 1 or not len(slopes) or not bool((slopes > 0).all()):
            raise ValueError(f"slopes must be positive numbers, got {slopes.tolist()}")
        super().__init__(len(slopes))
        self.register_float32_buffer("slopes", slopes)


def rescalings(preset: Preset) -> dict[str, dict]:
    """Label -> Rope arguments of the context extensions of the model trained with plain
    RoPE ("rope": the control).

    YaRN multiplies cos and sin by its temperature 0.1 ln s + 1 (the logits by its
    square); "rope_yarn_notemp" is the same YaRN with that factor 1 (NTK-by-parts).
    """
    s, beyond, original = (
        float(preset.finetune_factor),
        float(preset.beyond_factor),
        preset.train_len,
    )
    yarn = {"rope_type": "yarn", "original_max_position_embeddings": original}
    return {
        "rope": {},
        "rope_pi": {"rope_type": "linear", "factor": s},
        "rope_ntk": {"rope_type": "ntk", "factor": s},
        "rope_yarn": {**yarn, "factor": s},
        "rope_yarn_notemp": {**yarn, "factor": s, "attention_factor": 1.0},
        f"rope_yarn_x{preset.beyond_factor}": {**yarn, "factor": beyond},
    }


def with_rope(model, temperature: float | None = None, **rope_args):
    """A copy of a RoPE model whose every layer uses a rescaled RoPE (the weights are
    copied by value).

    `temperature` multiplies its cos and sin, as YaRN's attention factor does (the
    logits by its square): YaRN's temperature given to PI or NTK.
    """
    twin = copy.deepcopy(model)
    rope = Rope(twin.blocks[0].scheme.head_dim, **rope_args)
    if temperature is not None:  # before any call builds its cos and sin
        rope.attention_factor = float(temperature)
    rope = rope.to(next(twin.parameters()).device)
    for block in twin.blocks:
        block.scheme = rope
    return twin


@dataclass(frozen=True)
class Twin:
    """One evaluation of an ablation: RoPE weights (`source`: "trained", or the label
    of a fine-tuned extension) with other Rope arguments and temperature."""

    label: str
    variant: str  # "zero-shot": the trained weights; "toggled": the fine-tuned ones
    source: str
    rope_args: dict
    temperature: float | None = None


def ablation_twins(name: str, preset: Preset) -> list[Twin]:
    """The evaluations of an ablation, on the weights a RoPE run keeps.

    "temperature": YaRN's temperature 0.1 ln s + 1 given to PI and NTK (zero-shot, and
    on their fine-tuned weights), and taken from YaRN at s and at the larger factor
    (YaRN at s without it, zero-shot and fine-tuned, is in the RoPE run itself: its
    fine-tune is trained without the temperature; here the temperature is only switched
    off on the weights fine-tuned with it).
    """
    if name != "temperature":
        raise ValueError(f"unknown ablation {name!r}; choose from ['temperature']")
    ext = rescalings(preset)
    heat = yarn_mscale(float(preset.finetune_factor))
    x8 = f"rope_yarn_x{preset.beyond_factor}"
    cold = {"attention_factor": 1.0}
    return [
        Twin("rope_pi_temp", "zero-shot", "trained", ext["rope_pi"], heat),
        Twin("rope_pi_temp", "toggled", "rope_pi", ext["rope_pi"], heat),
        Twin("rope_ntk_temp", "zero-shot", "trained", ext["rope_ntk"], heat),
        Twin("rope_ntk_temp", "toggled", "rope_ntk", ext["rope_ntk"], heat),
        Twin("rope_yarn_notemp", "toggled", "rope_yarn", ext["rope_yarn_notemp"]),
        Twin(f"{x8}_notemp", "zero-shot", "trained", {**ext[x8], **cold}),
        Twin(f"{x8}_notemp", "toggled", x8, {**ext[x8], **cold}),
    ]


def parameter_counts(preset: Preset, runs=None) -> dict[str, int]:
    """Run name ("shaw", "alibi:heads8") -> the number of parameters of its model,
    for `runs` (default: the preset's schemes and its variations' runs)."""
    from .extrapolation_runs import build_model  # it imports this module

    if runs is None:
        runs = dict.fromkeys(
            name for name, _ in preset.runs if not preset.ablation(name)
        )
    counts = {}
    for run in runs:
        label, _, own = preset.for_run(run)
        model = build_model(label, own, "cpu")
        counts[run] = sum(p.numel() for p in model.parameters())
    return counts
