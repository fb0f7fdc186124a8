"""posenc.layer_schemes + posenc.attention reproduce transformers 5.23's attention, layer by layer, in 20 families.

For every attention layer of a tiny model of each family (tests/hf_layers.py) the module's
queries, keys and values before any position transform go through posenc.attention with
that layer's scheme, then the module's output gate and o_proj; the result must equal the
output transformers computed in a real forward (captured by a hook) to 1e-5: (a) a batch of
2 x 24 tokens, (b) left padding with generate()'s position ids, (c) packed documents
(position ids restarting at 0, no attention mask); then token-by-token decoding through
posenc.KVCache, and the known differences, each recorded as a test. File:line citations
are in transformers 5.23.0 (the notes behind them: notes/hf29/{A,B,C,D}/spec.md).
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache

import pytest

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -r requirements.txt)")
if transformers.__version__ != "5.23.0":
    pytest.skip(f"these cross-checks follow transformers 5.23.0's code line by line; found {transformers.__version__}", allow_module_level=True)

import torch  # noqa: E402

import hf_layers as hl  # noqa: E402
import posenc  # noqa: E402
from posenc.core import cpu_compiles_flex  # noqa: E402
from posenc.score.masks import mask_matrix  # noqa: E402

MODEL_TYPES = list(hl.BUILDERS)
BACKENDS = ("explicit", "sdpa", "flex_uncompiled")
TOL = dict(atol=1e-5, rtol=1e-5)
# families whose forward builds no packed-sequence mask: gpt_oss passes no position_ids to its mask functions
# (modeling_gpt_oss.py:459-469), ModernBERT's bidirectional masks never read them (masking_utils.py:1076-1078, 1312-1314)
NO_PACKING = ("gpt_oss", "modernbert")


@lru_cache(maxsize=None)
def captured(model_type: str, case: str) -> list:
    """transformers' (hidden states in, output) of every layer of a tiny model for one case, computed once."""
    return hl.run_model(hl.model(model_type), **hl.inputs(case))


def layers(model_type: str, case: str) -> list:
    """(index, attention module, hidden states in, transformers' output) for every softmax-attention layer."""
    mods = hl.attention_modules(hl.model(model_type))
    return [(i, mods[i], *cap) for i, cap in enumerate(captured(model_type, case)) if cap is not None]


def schemes_of(config, model) -> list:
    """posenc's schemes for a config, with the model's learned sink logits loaded."""
    return hl.load_sinks(posenc.layer_schemes(config), model)


def through_posenc(attn, h, scheme, positions, **kwargs) -> torch.Tensor:
    """The module's output with posenc in the middle: pre_position_qkv -> posenc.attention -> finish."""
    q, k, v = hl.pre_position_qkv(attn, h)
    kwargs.setdefault("causal", type(attn).__name__ != "ModernBertAttention")  # ModernBERT is an encoder
    with torch.no_grad():
        y = posenc.attention(q, k, v, scheme, q_positions=positions, k_positions=positions, scale=hl.content_scale(attn), **kwargs)
    return hl.finish(attn, y, h)


def refusal(scheme, backend: str) -> str | None:
    """The message with which a backend refuses a scheme it cannot express, None where it runs it."""
    if backend == "sdpa" and scheme.softcap is not None:
        return r"caps its logits \(softcap=5.*backend='sdpa' cannot express"
    if backend == "flex" and getattr(scheme, "sinks", None) is not None:
        return r"sink logits.*compiled for the CPU"
    return None


def index_masked(scheme, causal: bool, length: int = hl.L) -> tuple:
    """What transformers runs on packed rows where it builds no packed mask: the layer's RoPE on the restarted position ids,
    but its mask rule (causal, window) evaluated on indices, and no document boundary. posenc's masks follow positions, so
    the rule goes in as an explicit index mask, beside a Layer without the mask (same inner RoPE, same sink logits)."""
    idx = torch.arange(length)
    allowed = torch.ones(length, length, dtype=torch.bool) if scheme.mask_mod is None else mask_matrix(scheme.mask_mod, idx, idx)
    if causal:
        allowed &= idx[None, :] <= idx[:, None]
    if isinstance(scheme, posenc.Layer):
        assert scheme.softcap is None and scheme.temperature is None and scheme.query_scale == 1.0
        bare = posenc.Layer(scheme.inner, sinks=None if scheme.sinks is None else len(scheme.sinks))
        if scheme.sinks is not None:
            with torch.no_grad():
                bare.sinks.copy_(scheme.sinks)
        scheme = bare
    one_document = torch.zeros(hl.B, length, dtype=torch.long)
    return scheme, dict(causal=False, mask=allowed, q_documents=one_document, k_documents=one_document)


def reads_the_cache_index(model_type: str, scheme) -> bool:
    """Llama 4's NoPE-layer temperature reads the cache index, not position_ids (modeling_llama4.py:358-366)."""
    return model_type == "llama4_text" and getattr(scheme, "temperature", None) is not None


def case_inputs(case: str) -> tuple:
    """posenc's positions, its keyword arguments (padding mask) and the rows to compare (real tokens) for a case."""
    inp = hl.inputs(case)
    positions = torch.arange(hl.L) if inp["position_ids"] is None else inp["position_ids"]
    mask = inp["attention_mask"]
    if mask is None:
        return positions, {}, torch.ones(hl.B, hl.L, dtype=torch.bool)
    # transformers' padded query rows see no key and come out as the mean of all values (finfo.min, not -inf:
    # masking_utils.py:630-632), posenc's as zeros: only real rows are compared
    return positions, {"mask": mask[:, None, None, :].bool()}, mask.bool()


# ------------------------------------------------------------------------------------------------------------------
# 1-3: every layer of every family, plain, left-padded and packed, on every backend
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("case", ["a", "b", "c"])
def test_every_layer_matches_transformers(case, model_type, backend):
    model = hl.model(model_type)
    schemes = schemes_of(model.config, model)
    positions, kwargs, rows = case_inputs(case)
    for i, attn, h, expected in layers(model_type, case):
        scheme, layer_kwargs, layer_positions = schemes[i], dict(kwargs), positions
        if case != "a" and reads_the_cache_index(model_type, scheme):
            # the temperature follows the index 0..L-1 (test_llama4_nope_temperature_reads_the_cache_index): give posenc the
            # index as positions, and in packed rows transformers' documents explicitly (its causal mask is per document);
            # per row, (B, L): shared (L,) positions with per-row documents hit test_shared_positions_with_per_row_documents
            layer_positions = torch.arange(hl.L).expand(hl.B, hl.L)
            if case == "c":
                documents = hl.packed_documents(positions)
                layer_kwargs.update(q_documents=documents, k_documents=documents)
        if case == "c" and model_type in NO_PACKING:
            # no packed mask in transformers: documents see each other (test_transformers_builds_no_packed_mask_here)
            scheme, layer_kwargs = index_masked(scheme, causal=model_type != "modernbert")
        message = refusal(scheme, backend)
        if message:
            with pytest.raises(ValueError, match=message):
                through_posenc(attn, h, scheme, layer_positions, backend=backend, **layer_kwargs)
            continue
        got = through_posenc(attn, h, scheme, layer_positions, backend=backend, **layer_kwargs)
        torch.testing.assert_close(got[rows], expected[rows], **TOL, msg=lambda m: f"{model_type} ({case}) layer {i} on {backend}: {m}")


def _without_type(params):
    """rope_parameters without the "type" key that transformers keeps beside rope_type when it reads an older config."""
    return {k: _without_type(v) for k, v in params.items() if k != "type"} if isinstance(params, dict) else params


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_config_form_gives_the_same_layers(model_type):
    """The config object, its to_dict(), the multimodal wrapper (both forms) and the older config.json form
    (rope_theta + rope_scaling with "type") give schemes that reproduce the same outputs."""
    model = hl.model(model_type)
    forms = {"object": model.config, "to_dict": model.config.to_dict()}
    if model.posenc_wrapper is not None:
        forms.update(wrapper=model.posenc_wrapper, wrapper_dict=model.posenc_wrapper.to_dict())
    legacy = hl.legacy_dict(model.config)
    if legacy is not None:
        read_back = type(model.config).from_dict(copy.deepcopy(legacy))  # transformers reads the older form to the same RoPE
        assert _without_type(read_back.rope_parameters) == _without_type(model.config.rope_parameters)
        forms["legacy"] = legacy
    for form, config in forms.items():
        schemes = schemes_of(config, model)
        assert len(schemes) == model.config.num_hidden_layers
        for i, attn, h, expected in layers(model_type, "a"):
            got = through_posenc(attn, h, schemes[i], torch.arange(hl.L))
            torch.testing.assert_close(got, expected, **TOL, msg=lambda m: f"{model_type} from {form}, layer {i}: {m}")


@pytest.mark.parametrize("model_type", NO_PACKING)
def test_transformers_builds_no_packed_mask_here(model_type):
    """gpt_oss and ModernBERT let packed documents see each other: transformers differs from a true packed computation
    (posenc's, from the restarting positions) on every layer; test_every_layer_matches_transformers reproduces what it does."""
    model = hl.model(model_type)
    schemes = schemes_of(model.config, model)
    positions, _, _ = case_inputs("c")
    for i, attn, h, expected in layers(model_type, "c"):
        packed = through_posenc(attn, h, schemes[i], positions)
        assert (packed - expected).abs().max() > 1e-3, f"{model_type} layer {i}: transformers seems to pack after all"
        # one document alone is not what transformers does where the layer has a causal or window mask: posenc's masks
        # follow positions, which restart, where transformers' follow indices; only ModernBERT's global layers have neither
        one = torch.zeros(hl.B, hl.L, dtype=torch.long)
        alone = through_posenc(attn, h, schemes[i], positions, q_documents=one, k_documents=one)
        if model_type == "modernbert" and schemes[i].mask_mod is None:
            torch.testing.assert_close(alone, expected, **TOL)
        else:
            assert (alone - expected).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------------------
# 4: the known differences and quirks, as tests
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["b", "c"])
def test_llama4_nope_temperature_reads_the_cache_index(case):
    """modeling_llama4.py:358-366 computes the NoPE layers' temperature from arange(L) + past_seen_tokens, the cache index,
    not from position_ids; posenc reads positions, so with generate()'s or packed position ids the two differ, and posenc
    given the index as positions (with the padding mask, or transformers' documents) matches."""
    model = hl.model("llama4_text")
    schemes = posenc.layer_schemes(model.config)
    assert [i for i, s in enumerate(schemes) if reads_the_cache_index("llama4_text", s)] == [3]
    positions, kwargs, rows = case_inputs(case)
    i, attn, h, expected = layers("llama4_text", case)[3]
    from_position_ids = through_posenc(attn, h, schemes[i], positions, **kwargs)
    assert (from_position_ids - expected)[rows].abs().max() > 1e-3
    if case == "c":
        documents = hl.packed_documents(positions)
        kwargs.update(q_documents=documents, k_documents=documents)
    from_index = through_posenc(attn, h, schemes[i], torch.arange(hl.L).expand(hl.B, hl.L), **kwargs)
    torch.testing.assert_close(from_index[rows], expected[rows], **TOL)


@lru_cache(maxsize=None)
def deepseek_without_mscale():
    """Tiny DeepSeek-V3 whose rope_scaling has mscale_all_dim 1 and no mscale key."""
    return hl.build_deepseek_v3(mscale=None, mscale_all_dim=1.0)


@pytest.mark.parametrize("case", ["a", "b", "c"])
def test_deepseek_mscale_all_dim_without_mscale_gives_two_temperatures(case):
    """With mscale_all_dim but no mscale, YaRN's attention factor is 0.1 ln f + 1 on cos and sin (both keys are needed for
    their ratio: modeling_rope_utils.py:430-440) AND the softmax scale gets mscale_all_dim's factor squared
    (modeling_deepseek_v3.py:262-274, 405): the rope part of a logit gets both, the nope part the second only."""
    model = deepseek_without_mscale()
    factor = 0.1 * math.log(4.0) + 1.0
    assert model.rotary_emb.attention_scaling == pytest.approx(factor)
    assert model.layers[0].self_attn.scaling == pytest.approx(24 ** -0.5 * factor**2)
    schemes = posenc.layer_schemes(model.config)
    assert schemes[0].inner.attention_factor == pytest.approx(factor) and schemes[0].query_scale == pytest.approx(factor**2)
    positions, kwargs, rows = case_inputs(case)
    caps = hl.run_model(model, **hl.inputs(case))
    for i, (attn, (h, expected)) in enumerate(zip(hl.attention_modules(model), caps)):
        got = through_posenc(attn, h, schemes[i], positions, **kwargs)
        torch.testing.assert_close(got[rows], expected[rows], **TOL)


def test_gemma3_never_applies_attn_logit_softcapping():
    """Gemma3Attention stores attn_logit_softcapping but passes no softcap to the attention function
    (modeling_gemma3.py:323, 358-368); posenc's recipe ignores it too, and the cap would change the outputs."""
    model = hl.model("gemma3_text")
    assert model.config.attn_logit_softcapping == 5.0
    schemes = posenc.layer_schemes(model.config)
    assert all(s.softcap is None for s in schemes)
    for i, attn, h, expected in layers("gemma3_text", "a"):
        torch.testing.assert_close(through_posenc(attn, h, schemes[i], torch.arange(hl.L)), expected, **TOL)
        capped = posenc.Layer(getattr(schemes[i], "inner", schemes[i]), getattr(schemes[i], "mask", None), softcap=5.0)
        assert (through_posenc(attn, h, capped, torch.arange(hl.L)) - expected).abs().max() > 1e-3


def _layer_outputs_from(config_dict: dict, model_type: str) -> None:
    """Assert that posenc's schemes from a config.json dict reproduce the model transformers builds from that dict (case a)."""
    model = hl.twin(hl.model(model_type), config_dict)
    schemes = posenc.layer_schemes(config_dict)
    caps = hl.run_model(model, **hl.inputs("a"))
    for i, (attn, (h, expected)) in enumerate(zip(hl.attention_modules(model), caps)):
        got = through_posenc(attn, h, schemes[i], torch.arange(hl.L))
        torch.testing.assert_close(got, expected, **TOL, msg=lambda m: f"{model_type} layer {i}: {m}")


def test_olmo3_top_level_rope_theta_is_refused_as_ambiguous():
    """transformers gives a config.json's top-level rope_theta to OLMo 3's full layers only: configuration_olmo3.py:117-122
    pops it for full_attention, and the second pop for sliding_attention finds nothing (500000). posenc refuses to
    guess which the writer meant; at 500000, the published value, nothing differs and posenc builds it."""
    d = hl.legacy_dict(hl.model("olmo3").config)
    d["rope_theta"] = 10000.0
    config = transformers.Olmo3Config.from_dict(d)
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 5e5 != config.rope_parameters["full_attention"]["rope_theta"]
    with pytest.raises(ValueError, match="rope_theta=10000.0 at the top of an olmo3 config"):
        posenc.layer_schemes(d)


@pytest.mark.parametrize("model_type", ["gemma3_text", "modernbert", "olmo3"])
def test_legacy_rope_scaling_with_type_is_refused_where_transformers_ignores_it(model_type):
    """In the per-layer-type families transformers merges rope_scaling into an entry that already says rope_type
    'default' (configuration_gemma3.py:138-144, configuration_modernbert.py:128-136, configuration_olmo3.py:106-112),
    so an old {'type': 'linear', ...} block runs no scaling there; posenc says so instead of choosing."""
    d = hl.legacy_dict(hl.model(model_type).config)
    d["rope_scaling"] = {"type": "linear", "factor": 4.0}
    config = getattr(transformers, type(hl.model(model_type).config).__name__).from_dict(d)
    assert config.rope_parameters["full_attention"]["rope_type"] == "default"  # the scaling is gone
    with pytest.raises(ValueError, match="old key 'type'"):
        posenc.layer_schemes(d)


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "flex_uncompiled"])
def test_shared_positions_with_per_row_documents(backend):
    """Positions (L,) shared by the batch and documents given per row must give what the same positions per row give."""
    q, k, v = (torch.randn(2, 1, 6, 4, generator=torch.Generator().manual_seed(seed)) for seed in range(3))
    documents = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    shared, per_row = torch.arange(6), torch.arange(6).expand(2, 6)
    got = posenc.attention(q, k, v, q_positions=shared, k_positions=shared, q_documents=documents, k_documents=documents, backend=backend)
    want = posenc.attention(q, k, v, q_positions=per_row, k_positions=per_row, q_documents=documents, k_documents=documents, backend=backend)
    torch.testing.assert_close(got, want, **TOL)


# ------------------------------------------------------------------------------------------------------------------
# 5: token-by-token decoding through posenc.KVCache
# ------------------------------------------------------------------------------------------------------------------
DECODED = [  # (model_type, layer, tokens, what the layer's scheme must show)
    ("mistral", 0, 24, "('sliding_window', 8"),
    ("gemma2", 0, 24, "softcap=5"),
    ("llama4_text", 0, 24, "('chunked', 8)"),
    ("llama4_text", 3, 24, "temperature=LogFloorTemperature(beta=0.1, step=4"),
    ("gpt_oss", 0, 24, "sinks=4"),
    ("deepseek_v3", 0, 24, "rotated_part='last'"),
    ("gemma4_text", 5, 24, "rope_type='proportional'"),
    # LongRoPE: transformers picks the factors from max(position_ids) + 1 of each call (modeling_rope_utils.py:47-81), the
    # long ones for a full pass over 24 tokens; decoding, tokens 0-15 get the short ones (in transformers' own generate
    # too, until token 17 makes Phi3ForCausalLM drop its cache and recompute every key, modeling_phi3.py:497-510; posenc's
    # cache keeps the keys it rotated): 16 tokens keep both on the short factors (test_phi3_longrope_decoding_past_16_differs)
    ("phi3", 0, 16, "rope_type='longrope'"),
]


def _decode(model_type: str, layer: int, tokens: int) -> tuple:
    """posenc's outputs decoding `tokens` tokens one at a time through a KVCache, and transformers' full pass over them."""
    model = hl.model(model_type)
    ids = hl.inputs("a")["input_ids"][:, :tokens]
    h, expected = (captured(model_type, "a") if tokens == hl.L else hl.run_model(model, ids))[layer]
    attn = hl.attention_modules(model)[layer]
    scheme = schemes_of(model.config, model)[layer]
    q, k, v = hl.pre_position_qkv(attn, h)
    cache, steps = posenc.KVCache(scheme), []
    for t in range(tokens):
        with torch.no_grad():
            y = cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], torch.tensor([t]), scale=hl.content_scale(attn))
        steps.append(hl.finish(attn, y, h[:, t : t + 1]))
        if scheme.window is not None:
            assert len(cache) <= scheme.window  # the cache rolls
    return scheme, torch.cat(steps, dim=1), expected


@pytest.mark.parametrize("model_type, layer, tokens, shows", DECODED, ids=[f"{m}-{i}" for m, i, _, _ in DECODED])
def test_decoding_token_by_token_matches_the_full_pass(model_type, layer, tokens, shows):
    scheme, decoded, expected = _decode(model_type, layer, tokens)
    assert shows in repr(scheme)
    for t in range(tokens):
        torch.testing.assert_close(decoded[:, t], expected[:, t], **TOL, msg=lambda m: f"{model_type} layer {layer}, token {t}: {m}")


def test_phi3_longrope_decoding_past_16_differs():
    """Decoding 24 tokens, posenc rotates tokens 0-15 with the short factors and keeps those keys, while transformers'
    24-token full pass rotates all of them with the long ones: the steps before 16 differ (all but the first, whose one key
    sits at the query's own position, where every frequency gives the same logit)."""
    _, decoded, expected = _decode("phi3", 0, 24)
    torch.testing.assert_close(decoded[:, 0], expected[:, 0], **TOL)
    assert (decoded[:, 1:16] - expected[:, 1:16]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------------------
# 6: backends' refusals, and KV caches per layer
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type, backend", [("gemma2", "sdpa"), ("gpt_oss", "flex")])
def test_backends_refuse_what_they_cannot_express(model_type, backend):
    """sdpa cannot soft-cap (Gemma 2); compiled FlexAttention cannot return the log-sum-exp sinks need on the CPU (gpt-oss)."""
    model = hl.model(model_type)
    schemes = schemes_of(model.config, model)
    for i, attn, h, _ in layers(model_type, "a"):
        with pytest.raises(ValueError, match=refusal(schemes[i], backend)):
            through_posenc(attn, h, schemes[i], torch.arange(hl.L), backend=backend)


@pytest.mark.skipif(not cpu_compiles_flex(), reason="inductor cannot compile FlexAttention for this CPU")
@pytest.mark.parametrize("model_type, layer, case", [("mistral", 0, "b"), ("gemma2", 0, "a")])
def test_compiled_flex_matches_transformers(model_type, layer, case):
    """Compiled FlexAttention (a few seconds per kernel on the CPU, so two layers only): a window over per-row positions with
    a padding mask, and a soft-capped window."""
    model = hl.model(model_type)
    scheme = schemes_of(model.config, model)[layer]
    positions, kwargs, rows = case_inputs(case)
    i, attn, h, expected = layers(model_type, case)[layer]
    got = through_posenc(attn, h, scheme, positions, backend="flex", **kwargs)
    torch.testing.assert_close(got[rows], expected[rows], **TOL)


def test_kv_caches_for_layers_refuse_linear_attention_by_name():
    schemes = posenc.layer_schemes(hl.model("qwen3_next").config)
    assert schemes[:3] == ["linear_attention"] * 3 and isinstance(schemes[3], posenc.Rope)
    with pytest.raises(TypeError, match=r"layer 0 is 'linear_attention', not an attention scheme"):
        posenc.KVCache.for_layers(schemes)
    assert len(posenc.KVCache.for_layers(schemes[3:])) == 1
