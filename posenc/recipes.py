"""The per-layer position recipes of today's model families, built from their transformers configs.

`layer_schemes(config)` returns one entry per layer: a posenc scheme that makes
posenc.attention compute that layer's attention as transformers 5.23 does, from the
layer's queries, keys and values (batch, heads, L, head_dim) after the projections and
any norm the model applies to them (QK-norm, Gemma 4's value norm), keys and values
repeated to the query heads; for MLA (deepseek_v3) queries and keys are [nope | rope]
per head, the key's one rope slice expanded to every head. What stays the caller's:
the content scale (1/sqrt(head_dim); Gemma 2 and 3 use query_pre_attn_scalar^-0.5,
Gemma 4 1.0) and, for an encoder (modernbert), causal=False. A layer that is not softmax
attention (Qwen3-Next's Gated DeltaNet) is returned as its layer type, a string.
Learned parts start at zero: gpt-oss's sink logits are `scheme.sinks`, to be loaded from
the checkpoint's `self_attn.sinks` like any other weight.

One short function per family, registered by model_type, as transformers'
`modeling_rope_utils` registers its RoPE functions. Each reads the fields its model
reads, with the same defaults; a field about positions that it does not read is an
error (posenc.hf_config).
"""

from __future__ import annotations

from collections.abc import Callable

from ._checks import choice
from .hf_config import Fields
from .layer import Layer, LogFloorTemperature
from .qk.rope_scaling import yarn_mscale
from .scheme import NoPE, Scheme
from .score.masks import bidirectional_window, chunked, sliding_window

RECIPES: dict[str, Callable[[Fields], list]] = {}
FULL, SLIDING = "full_attention", "sliding_attention"


def recipe(*model_types: str):
    """Register a family's recipe under its transformers model_type(s)."""

    def register(fn):
        for model_type in model_types:
            RECIPES[model_type] = fn
        return fn

    return register


def layer_schemes(config) -> list[Scheme | str]:
    """One posenc scheme per layer of a transformers model (its config object, or the dict of its config.json)."""
    fields = Fields(config)
    choice("model_type", fields.model_type, tuple(sorted(RECIPES)))
    schemes = RECIPES[fields.model_type](fields)
    fields.check_understood()
    return schemes


def _windowed(
    rope: Scheme | None, types: list[str], window: int | None
) -> list[Scheme]:
    """A layer type's scheme: the RoPE alone on full layers, with the causal window on sliding ones."""
    return [
        Layer(rope, sliding_window(int(window))) if t == SLIDING else (rope or NoPE())
        for t in types
    ]


@recipe("llama")
def llama(f: Fields) -> list:
    return [f.rope(f.flat_rope(), f.head_dim())] * f.num_layers


@recipe("mistral", "ministral", "qwen3_moe", "phi3", "glm4_moe")
def one_window_for_all(f: Fields) -> list:
    """Every layer alike: RoPE, with Mistral's window on all layers where the config sets one (Ministral: per layer_types)."""
    if f.model_type == "mistral" and f.get("layer_types") is not None:
        f.model_type = (
            "ministral"  # transformers' AutoConfig loads such a config as ministral
        )
    params = f.flat_rope()
    window = f.get(
        "sliding_window", 4096 if f.model_type in ("mistral", "ministral") else None
    )
    if f.model_type == "qwen3_moe":
        window = window if f.get("use_sliding_window", False) else None
        f.ignore(
            "max_window_layers"
        )  # a qwen2 field: qwen3_moe slides all layers or none
    if f.model_type == "glm4_moe":
        params.setdefault("partial_rotary_factor", 0.5)
        f.ignore("use_qk_norm")  # the caller's queries and keys come after the norm
    if f.model_type == "phi3":
        window, rope_type = (
            f.get("sliding_window"),
            params.pop("rope_type", None) or params.pop("type", "default"),
        )
        original = f.get("original_max_position_embeddings", 4096)
        if (
            rope_type != "default"
        ):  # Phi3Config runs "su" and "yarn" as LongRoPE; the top-level length wins but for "su"
            params.setdefault("original_max_position_embeddings", original)
            params["original_max_position_embeddings"] = (
                params["original_max_position_embeddings"]
                if rope_type == "su"
                else original
            )
        params["rope_type"] = "longrope" if rope_type in ("su", "yarn") else rope_type
    if f.model_type == "ministral":
        head_dim = int(f.require("head_dim"))
        types = f.layer_types(
            [SLIDING if window else FULL] * f.num_layers, (FULL, SLIDING)
        )
    else:
        head_dim = f.head_dim()
        types = [SLIDING if window else FULL] * f.num_layers
    rope = f.rope(params, head_dim, partial=f.model_type in ("phi3", "glm4_moe"))
    return _windowed(rope, types, window)


@recipe("qwen2", "qwen3")
def qwen(f: Fields) -> list:
    """Full RoPE; a window only where use_sliding_window is on, and then on the layers from max_window_layers up."""
    window, use = f.get("sliding_window"), f.get("use_sliding_window", False)
    window = window if use else None
    first = f.get("max_window_layers", 28)
    types = f.layer_types(
        [SLIDING if window and i >= first else FULL for i in range(f.num_layers)],
        (FULL, SLIDING),
    )
    return _windowed(
        f.rope(f.flat_rope(), f.head_dim(128 if f.model_type == "qwen3" else None)),
        types,
        window,
    )


@recipe("qwen3_next")
def qwen3_next(f: Fields) -> list:
    """3 Gated DeltaNet layers (no explicit position) to 1 attention layer with RoPE on the first quarter of each head."""
    interval = f.get("full_attention_interval", 4)
    types = f.layer_types(
        [
            FULL if (i + 1) % interval == 0 else "linear_attention"
            for i in range(f.num_layers)
        ],
        (FULL, "linear_attention"),
    )
    params = f.flat_rope()
    params.setdefault("partial_rotary_factor", 0.25)
    f.ignore(
        "linear_key_head_dim", "linear_value_head_dim"
    )  # the Gated DeltaNet layers' widths
    rope = f.rope(params, f.head_dim(256), partial=True)
    return [rope if t == FULL else t for t in types]


@recipe("smollm3")
def smollm3(f: Fields) -> list:
    """NoPE every 4th layer (no_rope_layers[i] == 1 means the layer USES RoPE); windows only on NoPE layers, if switched on."""
    n = f.num_layers
    interval = f.get("no_rope_layer_interval", 4)
    uses_rope = list(
        f.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    )
    window, use = f.get("sliding_window"), f.get("use_sliding_window", False)
    window = window if use else None
    types = f.layer_types(
        [SLIDING if window and not uses_rope[i] else FULL for i in range(n)],
        (FULL, SLIDING),
    )
    f.ignore("max_window_layers")
    rope = f.rope(f.flat_rope(2e6), f.head_dim())
    return [
        Layer(
            rope if uses_rope[i] else None,
            sliding_window(int(window)) if t == SLIDING else None,
        )
        for i, t in enumerate(types)
    ]


@recipe("llama4_text")
def llama4(f: Fields) -> list:
    """iRoPE: 3 chunked layers with interleaved RoPE to 1 full NoPE layer whose queries warm with position."""
    n = f.num_layers
    interval = f.get("no_rope_layer_interval", 4)
    uses_rope = list(
        f.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    )
    types = f.layer_types(
        ["chunked_attention" if r else FULL for r in uses_rope],
        (FULL, "chunked_attention"),
    )
    chunk = (
        f.get("attention_chunk_size", 8192)
        if "attention_chunk_size" not in f
        else f.require("attention_chunk_size")
    )
    tuning = f.get("attn_temperature_tuning", True)
    if not isinstance(tuning, bool):
        raise ValueError(
            f"attn_temperature_tuning must be true or false (transformers 5.23 refuses {tuning!r} too)"
        )
    temperature = (
        LogFloorTemperature(
            f.get("attn_scale", 0.1), f.get("floor_scale", 8192), offset=1.0
        )
        if tuning
        else None
    )
    f.ignore(
        "use_qk_norm"
    )  # a weightless L2 norm after RoPE: it commutes with the rotation, so the caller applies it
    rope = f.rope(f.flat_rope(5e5), f.head_dim(128), layout="interleaved")
    layers = []
    for i, t in enumerate(types):
        mask = chunked(int(chunk)) if t == "chunked_attention" else None
        layers.append(
            Layer(rope, mask)
            if uses_rope[i]
            else Layer(None, mask, temperature=temperature)
        )
    return layers


@recipe("ministral3")
def ministral3(f: Fields) -> list:
    """YaRN on every layer, and queries times 1 + beta ln(1 + floor(p / L_orig)) from the position ids (llama_4_scaling_beta)."""
    max_len = f.get("max_position_embeddings", 262144)
    defaults = {"type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 16384, "max_position_embeddings": max_len,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}  # fmt: skip
    params = f.flat_rope(defaults=defaults)
    beta = params.get("llama_4_scaling_beta")
    if beta is None:
        raise ValueError(
            "a ministral3 config needs rope_parameters['llama_4_scaling_beta'] (transformers fails without it)"
        )
    temperature = LogFloorTemperature(beta, params["original_max_position_embeddings"])
    rope = f.rope(params, f.head_dim(128), extra=("llama_4_scaling_beta",))
    window = f.get("sliding_window")
    return [
        Layer(
            rope,
            sliding_window(int(window)) if window else None,
            temperature=temperature,
        )
    ] * f.num_layers


@recipe("gemma2")
def gemma2(f: Fields) -> list:
    """Sliding and global layers in turn, one RoPE, every logit soft-capped at attn_logit_softcapping."""
    types = f.layer_types(
        [SLIDING if (i + 1) % 2 else FULL for i in range(f.num_layers)], (FULL, SLIDING)
    )
    window, cap = f.get("sliding_window", 4096), f.get("attn_logit_softcapping", 50.0)
    f.ignore(
        "query_pre_attn_scalar", "final_logit_softcapping", "sliding_window_size"
    )  # the caller's scale; the LM head's cap
    rope = f.rope(f.flat_rope(), f.head_dim(256))
    return [
        Layer(rope, sliding_window(int(window)) if t == SLIDING else None, softcap=cap)
        for t in types
    ]


def _per_type(
    f: Fields, defaults: dict, legacy_to: tuple[str, ...], thetas: dict
) -> dict:
    """RoPE parameters per layer type, as Gemma 3, ModernBERT and OLMo 3 convert them: rope_scaling to `legacy_to`, a theta each."""
    params = f.get("rope_parameters")
    if params and not f.nested(params):
        raise ValueError(
            f"a {f.model_type!r} config needs its rope_parameters per layer type ({SLIDING}, {FULL}); transformers 5.23 drops "
            f"a flat set such as {params} without a word (every layer runs default RoPE): give it per layer type"
        )
    params = {t: dict(p) for t, p in (params or defaults).items()}
    scaling = f.get("rope_scaling") or {}
    if "type" in scaling and "rope_type" not in scaling:
        raise ValueError(
            f"rope_scaling {scaling} names its type with the old key 'type': transformers 5.23 merges it into "
            f"{f.model_type!r}'s default entry, whose rope_type stays 'default', so it silently runs no scaling; "
            "write 'rope_type' if the scaling is meant (or drop it)"
        )
    for t in legacy_to:
        params[t].update(scaling)
    for t, (field, default) in thetas.items():
        params[t].setdefault("rope_theta", f.get(field, default))
    return params


@recipe("gemma3_text")
def gemma3(f: Fields) -> list:
    """5 local layers (window, base 10^4) to 1 global (base 10^6, linear x8 on the 4B-27B checkpoints)."""
    pattern = f.get("sliding_window_pattern", 6)
    f.ignore(
        "_sliding_window_pattern"
    )  # what to_dict() writes of it, once layer_types exist
    types = f.layer_types(
        [SLIDING if (i + 1) % pattern else FULL for i in range(f.num_layers)],
        (FULL, SLIDING),
    )
    if f.get("use_bidirectional_attention", False):
        raise ValueError(
            "use_bidirectional_attention=true (Gemma 3 as an encoder) is not a recipe posenc builds"
        )
    params = _per_type(
        f,
        {SLIDING: {}, FULL: {}},
        (FULL,),
        {FULL: ("rope_theta", 1e6), SLIDING: ("rope_local_base_freq", 1e4)},
    )
    f.ignore(
        "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping"
    )  # Gemma 3 never applies it
    ropes = {t: f.rope(params[t], f.head_dim(256)) for t in (FULL, SLIDING)}
    window = f.get("sliding_window", 4096)
    return [
        Layer(ropes[t], sliding_window(int(window))) if t == SLIDING else ropes[t]
        for t in types
    ]


@recipe("gemma4_text")
def gemma4(f: Fields) -> list:
    """5 sliding layers (RoPE, base 10^4) to 1 global with p-RoPE: 64 of 256 pairs of a 512-wide head turn (base 10^6)."""
    n = f.num_layers
    types = f.layer_types(
        [SLIDING if (i + 1) % 6 and i < n - 1 else FULL for i in range(n)],
        (FULL, SLIDING),
    )
    if f.get("use_bidirectional_attention") not in (None, False):
        raise ValueError(
            "use_bidirectional_attention is not a recipe posenc builds (it halves the window and drops causality)"
        )
    defaults = {
        SLIDING: {"rope_type": "default", "rope_theta": 1e4},
        FULL: {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1e6,
        },
    }
    params = f.get("rope_parameters") or defaults
    if not f.nested(params):
        raise ValueError(
            f"a gemma4_text config needs rope_parameters per layer type ({SLIDING}, {FULL}), got {params}"
        )
    per_layer = {int(i): v for i, v in (f.get("per_layer_config") or {}).items()}
    global_dim = int(f.get("global_head_dim", 512))
    f.ignore(
        "attention_k_eq_v",
        "num_kv_shared_layers",
        "num_global_key_value_heads",
        "final_logit_softcapping",
    )  # content side
    window, ropes = f.get("sliding_window", 512), {}
    layers = []
    for i, t in enumerate(types):
        head_dim = per_layer.get(i, {}).get(
            "head_dim", global_dim if t == FULL and not per_layer else None
        ) or f.head_dim(256)
        if (t, head_dim) not in ropes:
            ropes[t, head_dim] = f.rope(params[t], int(head_dim))
        rope = ropes[t, head_dim]
        layers.append(
            Layer(rope, sliding_window(int(window))) if t == SLIDING else rope
        )
    return layers


@recipe("gpt_oss")
def gpt_oss(f: Fields) -> list:
    """Window (128) and full layers in turn, YaRN x32 on both, a learned sink logit per head on every layer."""
    types = f.layer_types(
        [SLIDING if (i + 1) % 2 else FULL for i in range(f.num_layers)], (FULL, SLIDING)
    )
    defaults = {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    }
    rope = f.rope(f.flat_rope(150000.0, defaults), f.head_dim(64))
    window, heads = f.get("sliding_window", 128), f.num_heads
    return [
        Layer(rope, sliding_window(int(window)) if t == SLIDING else None, sinks=heads)
        for t in types
    ]


@recipe("deepseek_v3")
def deepseek_v3(f: Fields) -> list:
    """MLA: RoPE on the last qk_rope_head_dim of each [nope | rope] head; YaRN's mscale^2 multiplies the whole logit."""
    nope, rope_dim = (
        int(f.get("qk_nope_head_dim", 128)),
        int(f.get("qk_rope_head_dim", 64)),
    )
    params = {**f.flat_rope(), "partial_rotary_factor": rope_dim / (nope + rope_dim)}
    f.ignore(
        "head_dim", "qk_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank"
    )  # head_dim is overwritten with qk_rope_head_dim
    layout = "interleaved" if f.get("rope_interleave", True) else "half"
    rope = f.rope(
        params, nope + rope_dim, layout=layout, rotated_part="last", partial=True
    )
    if rope.inv_freq.numel() * 2 != rope_dim:
        raise ValueError(
            f"qk_rope_head_dim={rope_dim} of a {nope + rope_dim}-wide head does not come out as a whole rotated width"
        )
    rope_type = params.get("rope_type") or params.get("type") or "default"
    all_dim = params.get("mscale_all_dim")
    scale = (
        yarn_mscale(params.get("factor") or 1.0, all_dim) ** 2
        if rope_type != "default" and all_dim
        else 1.0
    )
    return [Layer(rope, query_scale=scale)] * f.num_layers


@recipe("cohere2")
def cohere2(f: Fields) -> list:
    """RNoPE-SWA: 3 window layers with interleaved RoPE to 1 global layer with no position at all."""
    pattern = f.get("sliding_window_pattern", 4)
    types = f.layer_types(
        [SLIDING if (i + 1) % pattern else FULL for i in range(f.num_layers)],
        (FULL, SLIDING),
    )
    rope, window = (
        f.rope(f.flat_rope(), f.head_dim(), layout="interleaved"),
        f.get("sliding_window", 4096),
    )
    return [
        Layer(rope, sliding_window(int(window))) if t == SLIDING else NoPE()
        for t in types
    ]


@recipe("modernbert")
def modernbert(f: Fields) -> list:
    """An encoder (run it with causal=False): every 3rd layer global (base 160,000), the rest +-local_attention/2 (base 10^4)."""
    every = f.get("global_attn_every_n_layers", 3)
    types = f.layer_types(
        [SLIDING if i % every else FULL for i in range(f.num_layers)], (FULL, SLIDING)
    )
    params = _per_type(
        f,
        {SLIDING: {}, FULL: {}},
        (FULL, SLIDING),
        {FULL: ("global_rope_theta", 160000.0), SLIDING: ("local_rope_theta", 1e4)},
    )
    ropes = {t: f.rope(params[t], f.head_dim()) for t in (FULL, SLIDING)}
    radius = int(f.get("local_attention", 128)) // 2
    f.ignore("sliding_window")  # a property: local_attention // 2
    return [
        Layer(ropes[t], bidirectional_window(radius)) if t == SLIDING else ropes[t]
        for t in types
    ]


@recipe("olmo3")
def olmo3(f: Fields) -> list:
    """3 window layers to 1 full, one base; YaRN (the published rope_scaling) on the full layers only."""
    types = f.layer_types(
        [SLIDING if (i + 1) % 4 else FULL for i in range(f.num_layers)], (FULL, SLIDING)
    )
    theta = f.get("rope_theta", 5e5)
    if theta != 5e5 and not f.get("rope_parameters"):
        raise ValueError(
            f"rope_theta={theta} at the top of an olmo3 config: transformers 5.23 gives it to the full layers only "
            "and 500000 to the sliding ones (configuration_olmo3.py:117-122); give rope_parameters per layer type"
        )
    params = _per_type(
        f,
        {SLIDING: {}, FULL: {}},
        (FULL,),
        {FULL: ("rope_theta", 5e5), SLIDING: ("rope_theta", 5e5)},
    )
    # transformers reads YaRN's truncate from the top level of the nested parameters, where it never is
    ropes = {t: f.rope(params[t], f.head_dim(), truncate=True) for t in (FULL, SLIDING)}
    window = f.get("sliding_window", 4096)
    return [
        Layer(ropes[t], sliding_window(int(window))) if t == SLIDING else ropes[t]
        for t in types
    ]
