"""Tiny transformers models of 20 families and adapters around their attention modules (for test_recipes_hf.py).

Each model is built from transformers 5.23 with every position feature of its family
switched on (scaling types, windows and chunks of 4-8 positions that a 24-token input
crosses, NoPE layers, temperatures, sinks, soft-caps, partial rotary, two bases), eager
attention, float32, and random weights large enough that every feature changes the output.

The adapters split an attention module into what posenc does not do and what it does:
`pre_position_qkv` (projections and norms, before any position transform), the position
part (posenc.attention with the layer's scheme) and `finish` (output gate, o_proj), with
`content_scale` the module's softmax scale without position-derived factors. Written from
the four verified adapter sets under notes/hf29 (their spec.md files cite transformers'
lines): each reproduces the module's output exactly when transformers' own position code
fills the middle.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache

import pytest
import torch
from torch import nn

# a helper module of tests/test_recipes_hf.py; collected too (pytest --doctest-modules imports it)
transformers = pytest.importorskip("transformers")

transformers.logging.set_verbosity_error()

B, L = 2, 24
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=32, vocab_size=101)
FULL, SLIDING = "full_attention", "sliding_attention"


# ------------------------------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def _randomize(model: nn.Module, seed: int) -> nn.Module:
    """Random, non-trivial weights: 1-D parameters (norm weights, biases, sinks) U(0.5, 1.5), embeddings N(0, 1), others N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if p.ndim == 1:
            p.copy_(0.5 + torch.rand(p.shape, generator=g))
        elif "embed" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[-1] if p.ndim == 2 else p.shape[-2]
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    return model.eval()


def _make(model_cls, config, seed: int = 0, wrapper=None) -> nn.Module:
    """The base model of `config`, eager and float32, randomized; `wrapper` (a multimodal config holding `config`) is kept on it."""
    assert config._attn_implementation == "eager", config._attn_implementation
    torch.manual_seed(seed)
    model = _randomize(model_cls(config).float(), seed)
    model.posenc_wrapper = wrapper
    return model


def _llama3(factor, low, high, original):
    """Llama 3's rope_scaling block."""
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high, "original_max_position_embeddings": original}


def build_llama():
    """Llama 3.1: llama3 scaling whose three bands (kept, smoothed, divided) all occur at head_dim 16, original 32; biases on."""
    cfg = transformers.LlamaConfig(**TINY, num_hidden_layers=2, max_position_embeddings=256, rope_theta=10000.0, rope_scaling=_llama3(8.0, 1.0, 4.0, 32),
                                   attention_bias=True, attn_implementation="eager")
    return _make(transformers.LlamaModel, cfg)


def build_llama4_text():
    """Llama 4 Scout through the Llama4Config wrapper: 3 chunked (8) RoPE layers with qk_norm to 1 NoPE layer with temperature (floor 4)."""
    text = dict(**TINY, num_hidden_layers=4, intermediate_size_mlp=48, num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=512,
                rope_theta=10000.0, rope_scaling=_llama3(16.0, 1.0, 1.0, 32), attention_chunk_size=8, use_qk_norm=True,
                attn_temperature_tuning=True, floor_scale=4, attn_scale=0.1)
    wrapper = transformers.Llama4Config(text_config=text, attn_implementation="eager")
    return _make(transformers.Llama4TextModel, wrapper.text_config, wrapper=wrapper)


def build_mistral():
    """Mistral 7B v0.1: a window of 8 on every layer."""
    cfg = transformers.MistralConfig(**TINY, num_hidden_layers=2, max_position_embeddings=256, rope_theta=10000.0, sliding_window=8, attn_implementation="eager")
    return _make(transformers.MistralModel, cfg)


def build_ministral():
    """Ministral 8B: 1 full layer to 3 sliding (window 8), from explicit layer_types."""
    cfg = transformers.MinistralConfig(**TINY, num_hidden_layers=4, max_position_embeddings=256, rope_theta=10000.0, sliding_window=8,
                                       layer_types=[FULL, SLIDING, SLIDING, SLIDING], attn_implementation="eager")
    return _make(transformers.MinistralModel, cfg)


def build_ministral3():
    """Ministral 3: YaRN x4 over 8 without mscale keys (cos/sin factor 1.139), llama_4_scaling_beta 0.1 over 8, window 8."""
    rope = {"type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8, "max_position_embeddings": 32,
            "beta_fast": 32.0, "beta_slow": 1.0, "llama_4_scaling_beta": 0.1}
    cfg = transformers.Ministral3Config(**TINY, num_hidden_layers=2, max_position_embeddings=32, sliding_window=8, rope_parameters=rope, attn_implementation="eager")
    return _make(transformers.Ministral3Model, cfg)


def build_smollm3():
    """SmolLM3: NoPE on layer 3 (of 4), which alone gets the window of 8 (use_sliding_window)."""
    cfg = transformers.SmolLM3Config(**TINY, num_hidden_layers=4, max_position_embeddings=256, rope_theta=10000.0, use_sliding_window=True, sliding_window=8,
                                     pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    return _make(transformers.SmolLM3Model, cfg)


def _yarn(original=8, **extra):
    """A YaRN block: factor 4 over `original` positions, so that 24 tokens run past it."""
    return {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": original, **extra}


def build_qwen2():
    """Qwen2.5 with YaRN x4 over 8 (legacy rope_scaling "type"), layers 2-3 sliding (use_sliding_window, max_window_layers 2)."""
    cfg = transformers.Qwen2Config(**TINY, num_hidden_layers=4, max_position_embeddings=32, rope_theta=10000.0,
                                   rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
                                   use_sliding_window=True, sliding_window=8, max_window_layers=2, attn_implementation="eager")
    return _make(transformers.Qwen2Model, cfg)


def build_qwen3():
    """Qwen3: head_dim 16 != hidden 48 / 4 heads, q/k RMSNorm, YaRN, layers 2-3 sliding, biases."""
    cfg = transformers.Qwen3Config(**{**TINY, "hidden_size": 48}, num_hidden_layers=4, max_position_embeddings=32,
                                   rope_parameters={**_yarn(), "rope_theta": 1e6}, use_sliding_window=True, sliding_window=8, max_window_layers=2,
                                   attention_bias=True, attn_implementation="eager")
    return _make(transformers.Qwen3Model, cfg)


def build_qwen3_moe():
    """Qwen3-MoE: head_dim as an extra attribute, YaRN, every layer sliding (no layer_types in this family)."""
    cfg = transformers.Qwen3MoeConfig(**{**TINY, "hidden_size": 48}, num_hidden_layers=2, max_position_embeddings=32, rope_theta=1e6, rope_scaling=_yarn(),
                                      use_sliding_window=True, sliding_window=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                      attn_implementation="eager")
    return _make(transformers.Qwen3MoeModel, cfg)


def build_qwen3_next():
    """Qwen3-Next: [DeltaNet x3, attention] with head_dim 32, RoPE on the first quarter (8 dims), YaRN, sigmoid output gate."""
    cfg = transformers.Qwen3NextConfig(**{**TINY, "head_dim": 32}, num_hidden_layers=4, max_position_embeddings=32, rope_theta=1e7, partial_rotary_factor=0.25,
                                       rope_scaling=_yarn(), linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                                       linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=16, shared_expert_intermediate_size=16, attn_implementation="eager")
    return _make(transformers.Qwen3NextModel, cfg)


def build_phi3():
    """Phi-3/4-mini: fused qkv, 12 of 16 dims rotated, LongRoPE (short/long switch past 16, factor 4 from max/original), window 8."""
    g = torch.Generator().manual_seed(7)
    short = [round(1.0 + 0.5 * float(x), 4) for x in torch.rand(6, generator=g)]
    long = [round(1.0 + 7.0 * float(x), 4) for x in torch.rand(6, generator=g)]
    tiny = {k: v for k, v in TINY.items() if k != "head_dim"}
    cfg = transformers.Phi3Config(**tiny, num_hidden_layers=2, max_position_embeddings=64, original_max_position_embeddings=16, rope_theta=10000.0,
                                  partial_rotary_factor=0.75, rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
                                  sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    return _make(transformers.Phi3Model, cfg)


def build_glm4_moe():
    """GLM-4.5: head_dim 32 as an extra attribute, half of it rotated (rotate-half on the first 16 dims), q/k norm, biases."""
    cfg = transformers.Glm4MoeConfig(**{**TINY, "head_dim": 32}, num_hidden_layers=2, max_position_embeddings=64, rope_theta=1e6, attention_bias=True,
                                     use_qk_norm=True, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                                     first_k_dense_replace=1, n_group=1, topk_group=1, attn_implementation="eager")
    return _make(transformers.Glm4MoeModel, cfg)


def build_gemma2():
    """Gemma 2: sliding (8) and global layers in turn, query_pre_attn_scalar 24, attention soft-cap 5."""
    cfg = transformers.Gemma2Config(**TINY, num_hidden_layers=4, max_position_embeddings=64, rope_theta=10000.0, query_pre_attn_scalar=24, sliding_window=8,
                                    attn_logit_softcapping=5.0, attention_bias=True, attn_implementation="eager")
    return _make(transformers.Gemma2Model, cfg)


GEMMA3_TEXT = dict(**TINY, num_hidden_layers=6, max_position_embeddings=64, query_pre_attn_scalar=24, sliding_window=8, sliding_window_pattern=6,
                   rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0}, attn_logit_softcapping=5.0, attention_bias=True)


def build_gemma3_text():
    """Gemma 3 through the Gemma3Config wrapper: 5 local layers (window 8, base 1e4) to 1 global (1e6, linear x8); a soft-cap it never applies."""
    wrapper = transformers.Gemma3Config(text_config={"model_type": "gemma3_text", **GEMMA3_TEXT}, attn_implementation="eager")
    return _make(transformers.Gemma3TextModel, wrapper.text_config, wrapper=wrapper)


def build_gemma4_text():
    """Gemma 4 through the Gemma4Config wrapper: 5 sliding layers (head_dim 16) to 1 global with p-RoPE on head_dim 32, K = V, one kv head."""
    text = dict(**TINY, num_hidden_layers=6, max_position_embeddings=64, sliding_window=8, global_head_dim=32, num_global_key_value_heads=1,
                attention_k_eq_v=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=101, attention_bias=True)
    wrapper = transformers.Gemma4Config(text_config={"model_type": "gemma4_text", **text}, attn_implementation="eager")
    return _make(transformers.Gemma4TextModel, wrapper.text_config, wrapper=wrapper)


def build_modernbert():
    """ModernBERT (an encoder): layers 0 and 3 global (base 160000), the others +-4 (local_attention 8, base 1e4)."""
    cfg = transformers.ModernBertConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4, vocab_size=101,
                                        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                        global_attn_every_n_layers=3, local_attention=8, global_rope_theta=160000.0, local_rope_theta=10000.0,
                                        attention_bias=True, norm_bias=True, attn_implementation="eager")
    return _make(transformers.ModernBertModel, cfg)


def build_olmo3():
    """OLMo 3: 3 window (8) layers to 1 full, base 5e5, YaRN x4 over 8 on the full layers only, q/k norm over whole projections."""
    cfg = transformers.Olmo3Config(**{k: v for k, v in TINY.items() if k != "head_dim"}, num_hidden_layers=4, max_position_embeddings=32, sliding_window=8,
                                   pad_token_id=0, eos_token_id=2, rope_theta=5e5, rope_scaling=_yarn(beta_fast=32.0, beta_slow=1.0),
                                   attention_bias=True, attn_implementation="eager")
    return _make(transformers.Olmo3Model, cfg)


def build_cohere2():
    """Command R7B: 3 window (8) layers with interleaved RoPE (base 5e4) to 1 global NoPE layer."""
    cfg = transformers.Cohere2Config(**{k: v for k, v in TINY.items() if k != "head_dim"}, num_hidden_layers=4, max_position_embeddings=64, sliding_window=8,
                                     sliding_window_pattern=4, rope_theta=5e4, attention_bias=True, attn_implementation="eager")
    return _make(transformers.Cohere2Model, cfg)


def build_gpt_oss():
    """gpt-oss: window (4) and full layers in turn, YaRN x4 over 16 with truncate false, a sink logit per head, biases."""
    cfg = transformers.GptOssConfig(**TINY, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
                                    rope_theta=1000.0, rope_parameters={**_yarn(16), "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
                                    attn_implementation="eager")
    return _make(transformers.GptOssModel, cfg)


def build_deepseek_v3(mscale=1.0, mscale_all_dim=1.0):
    """DeepSeek-V3 MLA: [nope 16 | rope 8] heads, v 12, interleaved pairs, YaRN x4 over 8; a None mscale leaves the key out."""
    scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32, "beta_slow": 1,
               **({} if mscale is None else {"mscale": mscale}), **({} if mscale_all_dim is None else {"mscale_all_dim": mscale_all_dim})}
    cfg = transformers.DeepseekV3Config(vocab_size=101, hidden_size=64, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                                        first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                        max_position_embeddings=32, rope_interleave=True, rope_theta=10000.0, rope_scaling=scaling, attn_implementation="eager")
    return _make(transformers.DeepseekV3Model, cfg)


BUILDERS = {name[len("build_"):]: fn for name, fn in globals().items() if name.startswith("build_")}


@lru_cache(maxsize=None)
def model(model_type: str) -> nn.Module:
    """The tiny model of a model_type, built once per process."""
    return BUILDERS[model_type]()


# ------------------------------------------------------------------------------------------------------------------
# adapters
# ------------------------------------------------------------------------------------------------------------------
def attention_modules(model: nn.Module) -> list:
    """Each layer's softmax attention module, None for a layer without one (Qwen3-Next's Gated DeltaNet)."""
    return [getattr(layer, "self_attn", None) or getattr(layer, "attn", None) for layer in model.layers]


def run_model(model: nn.Module, input_ids, attention_mask=None, position_ids=None) -> list:
    """Run the model; per layer, (hidden states into the attention module, its output), None for non-attention layers.

    use_cache=False: with a cache object (config.use_cache defaults to True) masking_utils never detects packed
    sequences (masking_utils.py:873-881). ModernBERT takes no cache.
    """
    mods = attention_modules(model)
    caps = [None] * len(mods)

    def hook(i):
        def capture(mod, args, kwargs, out):
            h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            caps[i] = (h.detach().clone(), out[0].detach().clone())
        return capture

    handles = [m.register_forward_hook(hook(i), with_kwargs=True) for i, m in enumerate(mods) if m is not None]
    kwargs = {} if isinstance(model, transformers.ModernBertModel) else {"use_cache": False}
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return caps


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, L, H * d) -> (B, L, H, d)."""
    return x.view(*x.shape[:2], -1, head_dim)


def _mla_qkv(a, h):
    """DeepSeek MLA (modeling_deepseek_v3.py:437-455): q and k as [nope | rope] per head, k's one rope slice on every head."""
    q = a.q_proj(h) if a.q_lora_rank is None else a.q_b_proj(a.q_a_layernorm(a.q_a_proj(h)))
    q = _heads(q, a.qk_head_dim).transpose(1, 2)
    latent, k_rope = torch.split(a.kv_a_proj_with_mqa(h), [a.kv_lora_rank, a.qk_rope_head_dim], dim=-1)
    kv = _heads(a.kv_b_proj(a.kv_a_layernorm(latent)), a.qk_nope_head_dim + a.v_head_dim).transpose(1, 2)
    k_nope, v = torch.split(kv, [a.qk_nope_head_dim, a.v_head_dim], dim=-1)
    k_rope = k_rope[:, None].expand(-1, k_nope.shape[1], -1, -1)
    return q, torch.cat((k_nope, k_rope), dim=-1), v


@torch.no_grad()
def pre_position_qkv(attn: nn.Module, h: torch.Tensor):
    """q (B, Hq, L, dq), k (B, Hq, L, dq), v (B, Hq, L, dv) as posenc.attention takes them: after the projections and norms, before any
    position transform, keys and values repeated to the query heads (kv head j serves query heads j*g .. j*g+g-1).

    Llama 4 applies its weightless L2 norm after RoPE (modeling_llama4.py:349-356); a rotation keeps mean(x^2), so it is applied here
    before (float rounding apart). Gemma 4's global layers with attention_k_eq_v take v from the raw k projection and norm it without
    weight (modeling_gemma4.py:1221-1236). OLMo 3 norms q and k over the whole projection (modeling_olmo3.py:161-162).
    """
    name = type(attn).__name__
    if name == "DeepseekV3Attention":
        return _mla_qkv(attn, h)
    d = attn.head_dim
    if name == "ModernBertAttention":  # fused Wqkv: [q | k | v], each head-major (modeling_modernbert.py:260-266)
        q, k, v = attn.Wqkv(h).view(*h.shape[:2], 3, -1, d).unbind(dim=2)
    elif name == "Phi3Attention":  # fused qkv_proj (modeling_phi3.py:218-222)
        nq, nk = attn.config.num_attention_heads * d, attn.num_key_value_heads * d
        qkv = attn.qkv_proj(h)
        q, k, v = _heads(qkv[..., :nq], d), _heads(qkv[..., nq:nq + nk], d), _heads(qkv[..., nq + nk:], d)
    elif name == "Olmo3Attention":
        q, k, v = _heads(attn.q_norm(attn.q_proj(h)), d), _heads(attn.k_norm(attn.k_proj(h)), d), _heads(attn.v_proj(h), d)
    else:
        if name == "Qwen3NextAttention":  # per head [query | gate] (modeling_qwen3_next.py:269-272)
            q = torch.chunk(_heads(attn.q_proj(h), 2 * d), 2, dim=-1)[0]
        else:
            q = _heads(attn.q_proj(h), d)
        k = _heads(attn.k_proj(h), d)
        v = k if getattr(attn, "v_proj", True) is None else _heads(attn.v_proj(h), d)
        if hasattr(attn, "qk_norm"):  # Llama 4
            q, k = attn.qk_norm(q), attn.qk_norm(k)
        elif hasattr(attn, "q_norm") and getattr(attn, "use_qk_norm", True):  # Qwen3, Qwen3-Next, GLM-4.5, Gemma 3, Gemma 4: per head
            q, k = attn.q_norm(q), attn.k_norm(k)
        if hasattr(attn, "v_norm"):  # Gemma 4
            v = attn.v_norm(v)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


@torch.no_grad()
def finish(attn: nn.Module, y: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The module's output from the attention output y (B, Hq, L, dv): Qwen3-Next's sigmoid gate, then o_proj (ModernBERT: Wo)."""
    out = y.transpose(1, 2).reshape(*h.shape[:2], -1)
    name = type(attn).__name__
    if name == "Qwen3NextAttention":  # modeling_qwen3_next.py:299-302
        gate = torch.chunk(_heads(attn.q_proj(h), 2 * attn.head_dim), 2, dim=-1)[1]
        out = out * torch.sigmoid(gate.reshape(*h.shape[:2], -1))
    if name == "ModernBertAttention":
        return attn.out_drop(attn.Wo(out))
    return attn.o_proj(out)


def content_scale(attn: nn.Module) -> float:
    """The softmax scale without position-derived factors: the module's `scaling` (head_dim^-0.5; Gemma 2/3 query_pre_attn_scalar^-0.5,
    Gemma 4 1.0), but qk_head_dim^-0.5 for DeepSeek (whose `scaling` holds YaRN's mscale^2) and head_dim^-0.5 for ModernBERT."""
    name = type(attn).__name__
    if name == "DeepseekV3Attention":
        return attn.qk_head_dim ** -0.5
    if name == "ModernBertAttention":
        return attn.head_dim ** -0.5
    return float(attn.scaling)


def load_sinks(schemes: list, model: nn.Module) -> list:
    """Copy each layer's learned sink logits (gpt-oss) into its scheme, as a checkpoint would: posenc's start at zero."""
    for scheme, attn in zip(schemes, attention_modules(model)):
        if getattr(scheme, "sinks", None) is not None:
            with torch.no_grad():
                scheme.sinks.copy_(attn.sinks)
    return schemes


# ------------------------------------------------------------------------------------------------------------------
# inputs and configs
# ------------------------------------------------------------------------------------------------------------------
def inputs(case: str) -> dict:
    """input_ids, attention_mask, position_ids of case "a" (plain), "b" (5 left pads in row 1, generate()'s positions) or "c" (packed)."""
    ids = torch.randint(3, 100, (B, L), generator=torch.Generator().manual_seed(123))
    if case == "a":
        return dict(input_ids=ids, attention_mask=None, position_ids=None)
    if case == "b":
        mask = torch.ones(B, L, dtype=torch.long)
        mask[1, :5] = 0
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # generation/utils.py:905-908
        return dict(input_ids=ids, attention_mask=mask, position_ids=positions)
    packed = torch.stack([torch.cat([torch.arange(10), torch.arange(14)]), torch.cat([torch.arange(7), torch.arange(17)])])
    return dict(input_ids=ids, attention_mask=None, position_ids=packed)


def packed_documents(position_ids: torch.Tensor) -> torch.Tensor:
    """masking_utils.find_packed_sequence_indices (masking_utils.py:750-779): a new document wherever a step is not +1."""
    return (torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1) != 1).cumsum(-1)


def legacy_dict(config) -> dict | None:
    """The config as an older config.json writes it: rope_theta and rope_scaling (with "type") instead of rope_parameters; None for Gemma 4, which has no such form."""
    d = config.to_dict()
    params = d.pop("rope_parameters")
    mt = d["model_type"]
    if mt == "gemma4_text":
        return None
    if mt in ("gemma3_text", "modernbert", "olmo3"):  # per layer type (configuration_gemma3.py:133-160, _modernbert.py:124-152, _olmo3.py:101-126)
        full, local = dict(params[FULL]), dict(params[SLIDING])
        names = {"gemma3_text": ("rope_theta", "rope_local_base_freq"), "modernbert": ("global_rope_theta", "local_rope_theta"), "olmo3": ("rope_theta", None)}[mt]
        d[names[0]] = full.pop("rope_theta")
        if names[1]:
            d[names[1]] = local.pop("rope_theta")
        params = full
    else:
        d["rope_theta"] = params.pop("rope_theta")
        if "partial_rotary_factor" in params:
            d["partial_rotary_factor"] = params.pop("partial_rotary_factor")
    params.pop("type", None)
    rope_type = params.pop("rope_type")
    # the per-layer-type families merge rope_scaling into a dict that already says rope_type "default", so their
    # config.json files (Gemma 3's {"factor": 8.0, "rope_type": "linear"}) name it rope_type: a "type" there is ignored
    key = "rope_type" if mt in ("gemma3_text", "modernbert", "olmo3") else "type"
    if rope_type != "default" or params:
        d["rope_scaling"] = {key: rope_type, **params}
    return d


def twin(model: nn.Module, config_dict: dict) -> nn.Module:
    """The same model, with the same weights, built from a config.json dict as from_pretrained reads it (the dict is not changed)."""
    config = type(model.config).from_dict({**copy.deepcopy(config_dict), "attn_implementation": "eager"})
    other = type(model)(config).float().eval()
    other.load_state_dict(model.state_dict())
    other.posenc_wrapper = None
    return other
