"""A transformers config, read the way posenc's recipes need it.

The config object or the dict of a config.json, old fields and new.

transformers 5 keeps RoPE's parameters in `rope_parameters`, keyed by layer type where
a model has several (Gemma 3: `sliding_attention` and `full_attention`); config.json
files still carry the older `rope_theta`, `rope_scaling` (with `type` for `rope_type`)
and a top-level `partial_rotary_factor`. `Fields` reads both, as transformers'
`convert_rope_params_to_dict` and `standardize_rope_params` do, without importing
transformers, and remembers what it read: a field about positions that no recipe read
is an error that names it (`Fields.check_understood`), never a silent default.
"""

from __future__ import annotations

import re

from .qk.rope import Rope, rope_parameters

FULL, SLIDING = "full_attention", "sliding_attention"

# fields that may change where or how position enters attention
POSITION_FIELD = re.compile(
    r"rope|window|position|sink|attention_chunk|dual_chunk|softcap|temperature|"
    r"attn_scale|floor_scale|nope|layer_types|interleave(?!_moe)|scaling_beta|mscale|"
    r"partial_rotary|head_dim|global_attn|local_attention|k_eq_v|per_layer_config|"
    r"query_pre_attn|sliding"
)
# multimodal configs whose language model is `text_config` (Llama 4, Gemma 3 and 4,
# Mistral 3 / Ministral 3)
WRAPPERS = ("llama4", "gemma3", "gemma4", "mistral3")
# rope_parameters keys each rope_type reads (beyond rope_type and rope_theta); the
# others are refused by name
_ROPE_KEYS = {
    rope_type: set(rope_parameters(rope_type)) - {"seq_len"}
    for rope_type in (
        "default",
        "linear",
        "dynamic",
        "yarn",
        "longrope",
        "llama3",
        "proportional",
    )
}
_SCALED = (
    "llama3",
    "yarn",
    "longrope",
)  # types whose original_max_position_embeddings defaults to max_position_embeddings


def as_dict(config) -> dict:
    """The config's fields as a dict: a dict as given (a config.json), a transformers
    config object through to_dict().
    """
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(
        "config must be a transformers config or the dict of a config.json, got "
        f"{type(config).__name__}"
    )


class Fields:
    """The fields of one language-model config, with transformers' defaults supplied by
    the recipe that reads them.
    """

    def __init__(self, config):
        fields = as_dict(config)
        if fields.get("model_type") in WRAPPERS:
            if not isinstance(fields.get("text_config"), dict) and not hasattr(
                fields.get("text_config"), "to_dict"
            ):
                raise ValueError(
                    f"a {fields['model_type']!r} config holds its language model in "
                    "text_config, which is missing"
                )
            fields = as_dict(fields["text_config"])
        self.fields, self.read = fields, {"model_type"}
        self.model_type = fields.get("model_type")

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def get(self, name: str, default=None):
        """The field's value, or `default` where the config lacks it or holds null
        (transformers' class default).
        """
        self.read.add(name)
        value = self.fields.get(name)
        return default if value is None else value

    def require(self, name: str):
        value = self.get(name)
        if value is None:
            raise ValueError(
                f"a {self.model_type!r} config needs {name!r} (transformers cannot "
                "build the model without it)"
            )
        return value

    def ignore(self, *names: str) -> None:
        """Fields that match the position words but do not change attention here (the LM
        head's cap, the content's norms).
        """
        self.read.update(names)

    def check_understood(self) -> None:
        unknown = sorted(
            k
            for k, v in self.fields.items()
            if v is not None and POSITION_FIELD.search(k) and k not in self.read
        )
        if unknown:
            raise ValueError(
                f"posenc's recipe for model_type {self.model_type!r} does not "
                f"understand the config field(s) {unknown}: it "
                "would have to guess what they do to attention, so it refuses (remove "
                "them only if they do nothing in your model)"
            )

    @property
    def num_layers(self) -> int:
        return int(self.require("num_hidden_layers"))

    @property
    def num_heads(self) -> int:
        return int(self.require("num_attention_heads"))

    def head_dim(self, default: int | None = None) -> int:
        """head_dim where the config has it, else `default`, else hidden_size //
        num_attention_heads.
        """
        head_dim = self.get("head_dim", default)
        return (
            int(head_dim)
            if head_dim is not None
            else int(self.require("hidden_size")) // self.num_heads
        )

    def every(self, n: int, other: str) -> list[str]:
        """Layer types with one full-attention layer in every n, the n-th: the others
        `other`.
        """
        return [FULL if (i + 1) % n == 0 else other for i in range(self.num_layers)]

    def uses_rope(self) -> list[int]:
        """no_rope_layers, where 1 means the layer USES RoPE; by default every 4th has
        none.
        """
        every = self.get("no_rope_layer_interval", 4)
        default = [int((i + 1) % every != 0) for i in range(self.num_layers)]
        return list(self.get("no_rope_layers") or default)  # [] too means the default

    def layer_types(
        self, default: list[str], accepted: tuple[str, ...] = (FULL, SLIDING)
    ) -> list[str]:
        types = list(self.get("layer_types", default))
        if len(types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(types)} entries for "
                f"num_hidden_layers={self.num_layers}"
            )
        legacy = {
            "attention": "full_attention",
            "sliding": "sliding_attention",
            "mamba": "linear_attention",
        }
        types = [legacy.get(t, t) for t in types]
        for i, t in enumerate(types):
            if t not in accepted:
                raise ValueError(
                    f"layer_types[{i}] is {t!r}; posenc's {self.model_type!r} recipe "
                    f"knows {list(accepted)}"
                )
        return types

    def flat_rope(
        self, default_theta: float = 10000.0, defaults: dict | None = None
    ) -> dict:
        """One set of RoPE parameters for every layer: rope_scaling (old) or
        rope_parameters, with rope_theta and partial_rotary_factor.
        """
        params = dict(
            self.get("rope_scaling") or self.get("rope_parameters") or defaults or {}
        )
        if self.nested(params):
            raise ValueError(
                f"rope_parameters of a {self.model_type!r} config hold one set for "
                f"every layer, got one per layer type: {sorted(params)}"
            )
        params.setdefault("rope_theta", self.get("rope_theta", default_theta))
        if self.get("partial_rotary_factor") is not None:
            params.setdefault(
                "partial_rotary_factor", self.get("partial_rotary_factor")
            )
        return params

    def nested(self, params: dict) -> bool:
        return any(
            key in ("full_attention", "sliding_attention", "chunked_attention")
            for key in params
        )

    def rope_per_type(self, scaled: tuple[str, ...], thetas: dict) -> dict:
        """RoPE parameters per layer type, as Gemma 3, ModernBERT and OLMo 3 read them.

        An old `rope_scaling` goes to the layer types in `scaled`; each type takes its
        base
        from the field `thetas[type]` names, (field, default), unless its entry has one.
        """
        params = self.get("rope_parameters")
        if params and not self.nested(params):
            raise ValueError(
                f"a {self.model_type!r} config needs its rope_parameters per layer "
                "type "
                f"({SLIDING}, {FULL}); transformers 5.23 drops a flat set such as "
                f"{params} without a word (every layer runs default RoPE)"
            )
        params = {t: dict(p) for t, p in (params or {SLIDING: {}, FULL: {}}).items()}
        scaling = self.get("rope_scaling") or {}
        if "type" in scaling and "rope_type" not in scaling:
            raise ValueError(
                f"rope_scaling {scaling} names its type with the old key 'type': "
                f"transformers 5.23 merges it into {self.model_type!r}'s default "
                "entry, whose rope_type stays 'default', so it silently runs no "
                "scaling; write 'rope_type' if the scaling is meant (or drop it)"
            )
        for t in scaled:
            params[t].update(scaling)
        for t, (field, default) in thetas.items():
            params[t].setdefault("rope_theta", self.get(field, default))
        return params

    def rope(
        self,
        params: dict,
        head_dim: int,
        *,
        layout: str = "half",
        rotated_part: str = "first",
        partial: bool = False,
        truncate=None,
        extra=(),
    ) -> Rope:
        """The Rope these parameters give, with transformers' float32 frequencies.

        (numerics="transformers").

        `partial`: the family rotates part of each head where partial_rotary_factor < 1
        (else a
        factor below 1 is refused: transformers would ignore it for some rope_types and
        not
        others). `truncate` overrides YaRN's (transformers reads it from the top level
        of a nested
        config). `extra`: keys the recipe reads itself (Mistral's llama_4_scaling_beta).
        """
        params = dict(params)
        rope_type = (
            params.pop("rope_type", None) or params.pop("type", None) or "default"
        )
        params.pop("type", None)
        base = float(params.pop("rope_theta"))
        for key in extra:
            params.pop(key, None)
        if rope_type not in _ROPE_KEYS:
            raise ValueError(
                f"rope_type {rope_type!r} of a {self.model_type!r} config is not one "
                f"posenc builds ({sorted(_ROPE_KEYS)})"
            )
        factor = params.pop("partial_rotary_factor", 1.0)
        if rope_type == "proportional":
            params["partial_rotary_factor"] = factor
        elif factor != 1.0 and not partial:
            raise ValueError(
                f"partial_rotary_factor={factor} in a {self.model_type!r} config: "
                "this family's attention rotates whole heads"
            )
        unknown = sorted(
            set(params) - _ROPE_KEYS[rope_type] - {"max_position_embeddings"}
        )
        if unknown:
            raise ValueError(
                f"rope_parameters of a {self.model_type!r} config hold {unknown}, "
                f"which rope_type {rope_type!r} does not read"
            )
        max_len = params.pop("max_position_embeddings", None) or self.get(
            "max_position_embeddings"
        )
        if rope_type in _SCALED:
            params.setdefault("original_max_position_embeddings", max_len)
        if rope_type in ("dynamic", "yarn", "longrope") and max_len is not None:
            params["max_position_embeddings"] = int(max_len)
        if rope_type == "yarn":
            params["beta_fast"] = (
                params.get("beta_fast") or 32.0
            )  # transformers' `or`: a 0 or null is the default
            params["beta_slow"] = params.get("beta_slow") or 1.0
            params["truncate"] = (
                params.get("truncate", True) if truncate is None else truncate
            )
        params = {k: v for k, v in params.items() if v is not None}
        kwargs = (
            {"partial_rotary_factor": factor}
            if rope_type != "proportional" and factor != 1.0
            else {}
        )
        return Rope(
            head_dim,
            base,
            layout,
            rope_type,
            "transformers",
            rotated_part,
            **kwargs,
            **params,
        )
