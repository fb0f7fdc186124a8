"""The per-layer position recipes of today's model families, from transformers configs.

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
from .hf_config import FULL, SLIDING, Fields
from .layer import Layer, LogFloorTemperature
from .qk.rope_scaling import yarn_mscale
from .scheme import NoPE, Scheme
from .score.masks import bidirectional_window, chunked, sliding_window

RECIPES: dict[str, Callable[[Fields], list]] = {}
CHUNKED, LINEAR = "chunked_attention", "linear_attention"


def recipe(*model_types: str):
    """Register a family's recipe under its transformers model_type(s)."""

    def register(fn):
        for model_type in model_types:
            RECIPES[model_type] = fn
        return fn

    return register


def layer_schemes(config) -> list[Scheme | str]:
    """One posenc scheme per layer of a transformers model, in a list: the layer's
    Scheme, or its layer type (a str) where it is not softmax attention.

    Args:
        config: the model's transformers config object, or the dict of its
            config.json (a multimodal wrapper with a `text_config` too).

    Raises:
        ValueError: an unsupported model_type, or a config field about positions
            that the recipe does not read (the message names it).

    Example:
        >>> import posenc
        >>> config = {"model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 64,
        ...           "num_attention_heads": 4, "head_dim": 16, "sliding_window": 8}
        >>> [(s.inner.name, s.window, s.softcap) for s in posenc.layer_schemes(config)]
        [('rope', 8, 50.0), ('rope', None, 50.0)]
    """
    fields = Fields(config)
    choice("model_type", fields.model_type, tuple(sorted(RECIPES)))
    schemes = RECIPES[fields.model_type](fields)
    fields.check_understood()
    return schemes


def windowed(rope: Scheme | None, types: list[str], window) -> list[Scheme]:
    """Each layer's scheme: the RoPE alone on full layers, in a window on sliding."""
    inner = rope or NoPE()
    return [
        Layer(rope, sliding_window(int(window))) if t == SLIDING else inner
        for t in types
    ]


@recipe("llama")
def llama(f: Fields) -> list:
    return [f.rope(f.flat_rope(), f.head_dim())] * f.num_layers


@recipe("mistral", "ministral")
def mistral(f: Fields) -> list:
    """A window on every layer where the config sets one (Ministral: per layer type)."""
    if f.get("layer_types") is not None:
        f.model_type = "ministral"  # as transformers' AutoConfig loads such a config
    window = f.get("sliding_window", 4096)
    if f.model_type == "ministral":
        head_dim = int(f.require("head_dim"))  # MinistralConfig derives none
        types = f.layer_types([SLIDING if window else FULL] * f.num_layers)
    else:
        head_dim, types = f.head_dim(), [SLIDING if window else FULL] * f.num_layers
    return windowed(f.rope(f.flat_rope(), head_dim), types, window)


@recipe("qwen2", "qwen3", "qwen3_moe")
def qwen(f: Fields) -> list:
    """Full RoPE; a window where use_sliding_window is on: from max_window_layers up
    (qwen2, qwen3) or on every layer (qwen3_moe, which has no max_window_layers)."""
    window = f.get("sliding_window") if f.get("use_sliding_window", False) else None
    first = 0 if f.model_type == "qwen3_moe" else f.get("max_window_layers", 28)
    f.ignore("sliding_window", "max_window_layers")
    default = [SLIDING if window and i >= first else FULL for i in range(f.num_layers)]
    types = default if f.model_type == "qwen3_moe" else f.layer_types(default)
    head_dim = f.head_dim(128 if f.model_type == "qwen3" else None)
    return windowed(f.rope(f.flat_rope(), head_dim), types, window)


@recipe("qwen3_next")
def qwen3_next(f: Fields) -> list:
    """3 Gated DeltaNet layers (no explicit position) to 1 attention layer, RoPE on the
    first quarter of each head."""
    every = f.get("full_attention_interval", 4)
    types = f.layer_types(f.every(every, LINEAR), (FULL, LINEAR))
    params = f.flat_rope()
    params.setdefault("partial_rotary_factor", 0.25)
    f.ignore(
        "linear_key_head_dim", "linear_value_head_dim"
    )  # the DeltaNet layers' widths
    rope = f.rope(params, f.head_dim(256), partial=True)
    return [rope if t == FULL else t for t in types]


@recipe("phi3")
def phi3(f: Fields) -> list:
    """LongRoPE (Phi3Config runs "su" and "yarn" as it too); a window on every layer."""
    params = f.flat_rope()
    rope_type = params.pop("rope_type", None) or params.pop("type", "default")
    params.pop("type", None)
    original = f.get("original_max_position_embeddings", 4096)
    if rope_type != "default":  # the top-level length wins, but for the old "su"
        params.setdefault("original_max_position_embeddings", original)
        if rope_type != "su":
            params["original_max_position_embeddings"] = original
    params["rope_type"] = "longrope" if rope_type in ("su", "yarn") else rope_type
    window = f.get("sliding_window")
    types = [SLIDING if window else FULL] * f.num_layers
    return windowed(f.rope(params, f.head_dim(), partial=True), types, window)


@recipe("glm4_moe")
def glm4_moe(f: Fields) -> list:
    """RoPE on the first half of each head (partial_rotary_factor 0.5), every layer."""
    params = f.flat_rope()
    params.setdefault("partial_rotary_factor", 0.5)
    f.ignore("use_qk_norm")  # the caller's queries and keys come after the norm
    return [f.rope(params, f.head_dim(), partial=True)] * f.num_layers


@recipe("smollm3")
def smollm3(f: Fields) -> list:
    """NoPE every 4th layer (no_rope_layers[i] == 1: the layer USES RoPE); windows only
    on the NoPE layers, and only where use_sliding_window is on."""
    uses_rope = f.uses_rope()
    window = f.get("sliding_window") if f.get("use_sliding_window", False) else None
    f.ignore("sliding_window", "max_window_layers")
    default = [SLIDING if window and not r else FULL for r in uses_rope]
    types = f.layer_types(default)
    rope = f.rope(f.flat_rope(2e6), f.head_dim())
    return [
        Layer(
            rope if r else None, sliding_window(int(window)) if t == SLIDING else None
        )
        for r, t in zip(uses_rope, types)
    ]


@recipe("llama4_text")
def llama4(f: Fields) -> list:
    """iRoPE: 3 chunked layers with interleaved RoPE to 1 full NoPE layer whose queries
    warm with position."""
    uses_rope = f.uses_rope()
    types = f.layer_types([CHUNKED if r else FULL for r in uses_rope], (FULL, CHUNKED))
    chunk = f.get("attention_chunk_size", 8192)
    if "attention_chunk_size" in f and f.fields["attention_chunk_size"] is None:
        raise ValueError(
            "attention_chunk_size=null: transformers 5.23 cannot run Llama 4"
        )
    tuning = f.get("attn_temperature_tuning", True)
    if not isinstance(tuning, bool):
        raise ValueError(
            "attn_temperature_tuning must be true or false (transformers 5.23 refuses "
            f"{tuning!r} too)"
        )
    step, beta = f.get("floor_scale", 8192), f.get("attn_scale", 0.1)
    temperature = LogFloorTemperature(beta, step, offset=1.0) if tuning else None
    # a weightless L2 norm after RoPE commutes with the rotation: the caller applies it
    f.ignore("use_qk_norm")
    rope = f.rope(f.flat_rope(5e5), f.head_dim(128), layout="interleaved")
    masks = [chunked(int(chunk)) if t == CHUNKED else None for t in types]
    return [
        Layer(rope, mask) if r else Layer(None, mask, temperature=temperature)
        for r, mask in zip(uses_rope, masks)
    ]


@recipe("ministral3")
def ministral3(f: Fields) -> list:
    """YaRN on every layer, and queries times 1 + beta ln(1 + floor(p / L_orig)), p the
    position id (llama_4_scaling_beta)."""
    defaults = {
        "type": "yarn",
        "rope_theta": 1e6,
        "factor": 16.0,
        "original_max_position_embeddings": 16384,
        "max_position_embeddings": f.get("max_position_embeddings", 262144),
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale_all_dim": 1.0,
        "mscale": 1.0,
        "llama_4_scaling_beta": 0.1,
    }
    params = f.flat_rope(defaults=defaults)
    beta = params.get("llama_4_scaling_beta")
    if beta is None:
        raise ValueError(
            "a ministral3 config needs rope_parameters['llama_4_scaling_beta'] "
            "(transformers fails without it)"
        )
    temperature = LogFloorTemperature(beta, params["original_max_position_embeddings"])
    rope = f.rope(params, f.head_dim(128), extra=("llama_4_scaling_beta",))
    window = f.get("sliding_window")
    mask = sliding_window(int(window)) if window else None
    return [Layer(rope, mask, temperature=temperature)] * f.num_layers


@recipe("gemma2")
def gemma2(f: Fields) -> list:
    """Sliding and global layers in turn, one RoPE, every logit soft-capped."""
    types = f.layer_types(f.every(2, SLIDING))
    window, cap = f.get("sliding_window", 4096), f.get("attn_logit_softcapping", 50.0)
    # the caller's content scale; the LM head's cap; a key transformers leaves unused
    f.ignore("query_pre_attn_scalar", "final_logit_softcapping", "sliding_window_size")
    rope = f.rope(f.flat_rope(), f.head_dim(256))
    masks = [sliding_window(int(window)) if t == SLIDING else None for t in types]
    return [Layer(rope, mask, softcap=cap) for mask in masks]


@recipe("gemma3_text")
def gemma3(f: Fields) -> list:
    """5 local layers (window, base 10^4) to 1 global (base 10^6, linear x8 on the 4B to
    27B checkpoints)."""
    f.ignore("_sliding_window_pattern")  # what to_dict() writes of the pattern
    types = f.layer_types(f.every(f.get("sliding_window_pattern", 6), SLIDING))
    if f.get("use_bidirectional_attention", False):
        raise ValueError(
            "use_bidirectional_attention (Gemma 3 as an encoder) is not built"
        )
    thetas = {FULL: ("rope_theta", 1e6), SLIDING: ("rope_local_base_freq", 1e4)}
    params = f.rope_per_type(scaled=(FULL,), thetas=thetas)
    # the caller's content scale; the LM head's cap; a cap Gemma 3 never applies
    f.ignore(
        "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping"
    )
    ropes = {t: f.rope(params[t], f.head_dim(256)) for t in (FULL, SLIDING)}
    window = f.get("sliding_window", 4096)
    return [Layer(ropes[t], sliding_window(int(window))) if t == SLIDING else ropes[t]
            for t in types]  # fmt: skip


@recipe("gemma4_text")
def gemma4(f: Fields) -> list:
    """5 sliding layers (RoPE, base 10^4) to 1 global with p-RoPE: 64 of the 256 pairs
    of a 512-wide head turn (base 10^6)."""
    n = f.num_layers
    last = [
        i == n - 1 for i in range(n)
    ]  # the last layer is global whatever the pattern
    types = f.layer_types(
        [FULL if end else t for t, end in zip(f.every(6, SLIDING), last)]
    )
    if f.get("use_bidirectional_attention") not in (None, False):
        raise ValueError(
            "use_bidirectional_attention (Gemma 4 as an encoder) is not built"
        )
    proportional = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    defaults = {
        SLIDING: {"rope_type": "default", "rope_theta": 1e4},
        FULL: {**proportional, "rope_theta": 1e6},
    }
    params = f.get("rope_parameters") or defaults
    if not f.nested(params):
        raise ValueError(
            f"gemma4_text needs rope_parameters per layer type, got {params}"
        )
    # to_dict() writes per_layer_config (keys "05", ...); a config.json, global_head_dim
    per_layer = {int(i): v for i, v in (f.get("per_layer_config") or {}).items()}
    global_dim = None if per_layer else int(f.get("global_head_dim", 512))
    f.ignore("attention_k_eq_v", "num_kv_shared_layers", "num_global_key_value_heads")
    f.ignore("final_logit_softcapping")  # content side, the LM head
    window, ropes, layers = f.get("sliding_window", 512), {}, []
    for i, t in enumerate(types):
        own = per_layer.get(i, {}).get("head_dim", global_dim if t == FULL else None)
        head_dim = int(own or f.head_dim(256))
        if (t, head_dim) not in ropes:
            ropes[t, head_dim] = f.rope(params[t], head_dim)
        rope = ropes[t, head_dim]
        layers.append(
            Layer(rope, sliding_window(int(window))) if t == SLIDING else rope
        )
    return layers


@recipe("gpt_oss")
def gpt_oss(f: Fields) -> list:
    """Window (128) and full layers in turn, YaRN x32 on both, a learned sink logit per
    head on every layer."""
    types = f.layer_types(f.every(2, SLIDING))
    defaults = {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    defaults |= {"truncate": False, "original_max_position_embeddings": 4096}
    rope = f.rope(f.flat_rope(150000.0, defaults), f.head_dim(64))
    window, heads = f.get("sliding_window", 128), f.num_heads
    masks = [sliding_window(int(window)) if t == SLIDING else None for t in types]
    return [Layer(rope, mask, sinks=heads) for mask in masks]


@recipe("deepseek_v3")
def deepseek_v3(f: Fields) -> list:
    """MLA: RoPE on the last qk_rope_head_dim of each [nope | rope] head; YaRN's
    mscale^2 multiplies the whole logit."""
    nope, width = (
        int(f.get("qk_nope_head_dim", 128)),
        int(f.get("qk_rope_head_dim", 64)),
    )
    params = {**f.flat_rope(), "partial_rotary_factor": width / (nope + width)}
    # head_dim is overwritten with qk_rope_head_dim; the rest are content-side widths
    f.ignore("head_dim", "qk_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank")
    layout = "interleaved" if f.get("rope_interleave", True) else "half"
    rope = f.rope(
        params, nope + width, layout=layout, rotated_part="last", partial=True
    )
    if rope.inv_freq.numel() * 2 != width:
        raise ValueError(f"qk_rope_head_dim={width} splits no {nope + width}-wide head")
    scaled = (params.get("rope_type") or params.get("type") or "default") != "default"
    all_dim = params.get("mscale_all_dim")
    factor = params.get("factor") or 1.0
    scale = yarn_mscale(factor, all_dim) ** 2 if scaled and all_dim else 1.0
    return [Layer(rope, query_scale=scale)] * f.num_layers


@recipe("cohere2")
def cohere2(f: Fields) -> list:
    """RNoPE-SWA: 3 window layers with interleaved RoPE to 1 global layer with no
    position at all."""
    types = f.layer_types(f.every(f.get("sliding_window_pattern", 4), SLIDING))
    rope = f.rope(f.flat_rope(), f.head_dim(), layout="interleaved")
    window = f.get("sliding_window", 4096)
    return [Layer(rope, sliding_window(int(window))) if t == SLIDING else NoPE()
            for t in types]  # fmt: skip


@recipe("modernbert")
def modernbert(f: Fields) -> list:
    """An encoder (run it with causal=False): every 3rd layer global (base 160,000),
    from layer 0; the rest +-local_attention/2 (base 10^4)."""
    every = f.get("global_attn_every_n_layers", 3)
    types = f.layer_types(
        [FULL if i % every == 0 else SLIDING for i in range(f.num_layers)]
    )
    thetas = {FULL: ("global_rope_theta", 160000.0), SLIDING: ("local_rope_theta", 1e4)}
    params = f.rope_per_type(scaled=(FULL, SLIDING), thetas=thetas)
    ropes = {t: f.rope(params[t], f.head_dim()) for t in (FULL, SLIDING)}
    radius = int(f.get("local_attention", 128)) // 2
    f.ignore("sliding_window")  # a property: local_attention // 2
    return [Layer(ropes[t], bidirectional_window(radius)) if t == SLIDING else ropes[t]
            for t in types]  # fmt: skip


@recipe("olmo3")
def olmo3(f: Fields) -> list:
    """3 window layers to 1 full, one base; YaRN (the published rope_scaling) on the
    full layers only."""
    types = f.layer_types(f.every(4, SLIDING))
    theta = f.get("rope_theta", 5e5)
    if theta != 5e5 and not f.get("rope_parameters"):
        raise ValueError(
            f"rope_theta={theta} at the top of an olmo3 config: transformers 5.23 "
            "gives it to the full layers only and 500000 to the sliding ones "
            "(configuration_olmo3.py:117-122); give rope_parameters per layer type"
        )
    thetas = {FULL: ("rope_theta", 5e5), SLIDING: ("rope_theta", 5e5)}
    params = f.rope_per_type(scaled=(FULL,), thetas=thetas)
    # transformers reads YaRN's truncate from the top of the nested parameters (unset)
    ropes = {t: f.rope(params[t], f.head_dim(), truncate=True) for t in (FULL, SLIDING)}
    window = f.get("sliding_window", 4096)
    return [Layer(ropes[t], sliding_window(int(window))) if t == SLIDING else ropes[t]
            for t in types]  # fmt: skip
