"""One layer's composed recipe (posenc.layer.Layer): sink logits, query temperatures, soft-capping, on every backend.

And what today's recipes need beside it: the rotated slice placed last (MLA), p-RoPE
("proportional"), the hard-cut bands, explicit document ids, per-layer models and caches.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.core import cpu_compiles_flex
from posenc.layer import Layer, LogFloorTemperature
from posenc.positions import packed
from posenc.qk.rope import apply_rope, rope_frequencies
from posenc.score.masks import chunked, sliding_window

BACKENDS = ("explicit", "sdpa", "flex_uncompiled")


def qkv(batch=2, heads=4, length=10, head_dim=8, v_dim=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, batch, heads, length, head_dim, generator=g).unbind(0)
    return q, k, torch.randn(batch, heads, length, v_dim or head_dim, generator=g)


def with_sinks(inner=None, mask=None, heads=4, seed=1):
    layer = Layer(inner, mask, sinks=heads)
    layer.sinks.data = torch.randn(heads, generator=torch.Generator().manual_seed(seed)) * 2
    return layer


def causal_scores(q, k, scale):
    scores = (q @ k.transpose(-1, -2)) * scale
    return scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), float("-inf"))


def test_sink_logits_are_one_more_column_that_takes_weight_and_gives_nothing():
    """gpt-oss's eager attention: append s_h to every row, softmax, drop the column (transformers' gpt_oss eager_attention_forward)."""
    q, k, v = qkv()
    layer = with_sinks()
    scores = causal_scores(q, k, 8**-0.5)
    column = layer.sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat((scores, column), -1), -1)[..., :-1]
    out, got = posenc.attention(q, k, v, layer, return_weights=True)
    torch.testing.assert_close(got, weights)
    torch.testing.assert_close(out, weights @ v)
    assert bool((got.sum(-1) < 1).all())  # the sink keeps the rest of each row's mass


def test_the_sink_identity_flex_uses():
    """softmax with a sink = softmax without it times sigmoid(LSE - s): the log-sum-exp is all a fused kernel needs."""
    q, k, v = qkv()
    layer = with_sinks()
    scores = causal_scores(q, k, 8**-0.5)
    plain = torch.softmax(scores, -1) @ v
    factor = torch.sigmoid(torch.logsumexp(scores, -1) - layer.sinks.view(1, -1, 1))[..., None]
    torch.testing.assert_close(posenc.attention(q, k, v, layer), plain * factor)


@settings(max_examples=25, deadline=None)
@given(heads=st.integers(1, 4), length=st.integers(1, 9), window=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_sinks_agree_on_every_backend(heads, length, window, seed):
    q, k, v = qkv(1, heads, length, 8, seed=seed)
    layer = with_sinks(posenc.Rope(8), sliding_window(window), heads, seed)
    reference = posenc.attention(q, k, v, layer)
    for backend in BACKENDS[1:]:
        with torch.no_grad():
            torch.testing.assert_close(posenc.attention(q, k, v, layer, backend=backend), reference, atol=2e-6, rtol=2e-6)


def test_sinks_learn_on_the_cpu_backends_and_fully_masked_rows_stay_zero():
    q, k, v = qkv(length=6)
    layer = with_sinks()
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., :3] = False  # left padding: the first three queries of row 0 see nothing
    for backend in ("explicit", "sdpa"):
        layer.zero_grad()
        out = posenc.attention(q, k, v, layer, mask=mask, backend=backend)
        assert torch.isfinite(out).all() and out[0, :, :3].abs().max() == 0
        out.square().sum().backward()
        assert layer.sinks.grad is not None and layer.sinks.grad.abs().min() > 0


def test_compiled_flex_refuses_sinks_on_the_cpu_by_name():
    q, k, v = qkv()
    with torch.no_grad(), pytest.raises(ValueError, match="sink logits.*flex_uncompiled"):
        posenc.attention(q, k, v, with_sinks(), backend="flex")


def test_softcap_caps_every_logit_before_mask_and_bias():
    q, k, v = qkv()
    q = q * 6  # logits large enough for the cap to bite
    layer = Layer(posenc.ALiBi(4), softcap=2.0)
    scores = torch.tanh((q @ k.transpose(-1, -2)) * 8**-0.5 / 2.0) * 2.0
    scores = scores + posenc.kernel.bias_matrix(posenc.ALiBi(4), range(10), range(10))
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(posenc.attention(q, k, v, layer), expected)
    with torch.no_grad():
        torch.testing.assert_close(posenc.attention(q, k, v, layer, backend="flex_uncompiled"), expected, atol=2e-6, rtol=2e-6)
    with pytest.raises(ValueError, match="softcap=2.*'sdpa' cannot express"):
        posenc.attention(q, k, v, layer, backend="sdpa")
    assert not torch.allclose(posenc.attention(q, k, v, Layer(posenc.ALiBi(4))), expected, atol=1e-3)


@pytest.mark.skipif(not cpu_compiles_flex(), reason="inductor cannot compile FlexAttention for this CPU")
def test_softcap_compiles_into_flex():
    q, k, v = qkv(length=16)
    layer = Layer(posenc.Rope(8), sliding_window(5), softcap=1.5)
    with torch.no_grad():
        torch.testing.assert_close(posenc.attention(q * 4, k, v, layer, backend="flex"), posenc.attention(q * 4, k, v, layer), atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize(
    "temperature, values",
    [  # (position, factor): the numbers of ../shared/reviews/models-2025-26.md, section 6
        (LogFloorTemperature(0.1, 8192, 1.0), [(8190, 1.0), (8191, 1.0693), (131071, 1.2833), (1048575, 1.486), (10485759, 1.7155)]),
        (LogFloorTemperature(0.1, 16384), [(0, 1.0), (16383, 1.0), (16384, 1.0693), (131071, 1.2079), (262143, 1.2773)]),
    ],
)
def test_log_floor_temperatures_of_llama4_and_mistral(temperature, values):
    positions = torch.tensor([p for p, _ in values])
    assert [round(float(x), 4) for x in temperature(positions)] == [x for _, x in values]


def test_a_temperature_scales_queries_by_their_position_and_leaves_keys_alone():
    q, k, v = qkv(length=12)
    temperature = LogFloorTemperature(0.5, 3, 1.0)
    layer = Layer(posenc.Rope(8), temperature=temperature, query_scale=1.7)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [-2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    factor = temperature(positions)[:, None, :, None] * 1.7
    expected = posenc.attention(q * factor, k, v, posenc.Rope(8), q_positions=positions, k_positions=positions)
    got = posenc.attention(q, k, v, layer, q_positions=positions, k_positions=positions)
    torch.testing.assert_close(got, expected)
    assert torch.equal(layer.transform_k(k, range(12)), posenc.Rope(8).transform_k(k, range(12)))


def test_layer_refuses_what_it_cannot_compose():
    with pytest.raises(ValueError, match="another composed layer"):
        Layer(Layer(posenc.Rope(8)))
    with pytest.raises(TypeError, match="mask must be a posenc.score.masks.Mask"):
        Layer(posenc.Rope(8), lambda b, h, q, k: q >= k)
    with pytest.raises(ValueError, match="reads 1-D positions"):
        Layer(posenc.MRope(16), temperature=LogFloorTemperature(0.1, 8))
    with pytest.raises(ValueError, match="softcap must be a finite number > 0"):
        Layer(softcap=-1.0)
    with pytest.raises(TypeError, match="sinks must be a positive integer"):
        Layer(sinks=2.5)
    with pytest.raises(ValueError, match="step must be a finite number > 0"):
        LogFloorTemperature(0.1, 0)


def test_a_layer_with_a_window_rolls_its_cache_and_decodes_as_one_pass():
    q, k, v = qkv(length=15)
    layer = with_sinks(posenc.Rope(8), sliding_window(4, num_sinks=1))
    full = posenc.attention(q, k, v, layer)
    cache = posenc.KVCache(layer)
    steps = [cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], [t]) for t in range(15)]
    torch.testing.assert_close(torch.cat(steps, 2), full)
    assert len(cache) == 5  # the sink position, the newest key and the three before it


def test_rotated_part_last_rotates_the_trailing_slice_as_mla_does():
    """DeepSeek's MLA heads are [nope | rope]: the last 4 of 12 dimensions rotate, with the frequencies of a 4-wide head."""
    x = torch.randn(1, 2, 7, 12)
    rope = posenc.Rope(12, rotated_part="last", layout="interleaved", partial_rotary_factor=4 / 12)
    inv_freq, _ = rope_frequencies(4)
    expected = torch.cat((x[..., :8], apply_rope(x[..., 8:], torch.arange(7), inv_freq, "interleaved")), -1)
    torch.testing.assert_close(rope.transform_qk(x, range(7)), expected)
    first = posenc.Rope(12, partial_rotary_factor=4 / 12)
    assert torch.equal(first.transform_qk(x, range(7))[..., 4:], x[..., 4:])
    with pytest.raises(ValueError, match="rotated_part must be one of 'first', 'last'"):
        posenc.Rope(12, rotated_part="middle")


def test_proportional_truncates_the_ladder_of_the_whole_head():
    """Gemma 4's global layers: 64 of 256 pairs turn, the slowest once every 188 tokens; partial rotation instead: 5 million."""
    inv_freq, factor = rope_frequencies(512, 1e6, "proportional", partial_rotary_factor=0.25)
    turning = inv_freq[inv_freq > 0]
    assert (len(inv_freq), len(turning), factor) == (256, 64, 1.0)
    assert round(2 * math.pi / float(turning.min())) == 188
    torch.testing.assert_close(turning.double(), 1e6 ** (-torch.arange(64, dtype=torch.float64) * 2 / 512), rtol=1e-7, atol=0)
    partial, _ = rope_frequencies(512, 1e6, partial_rotary_factor=0.25)
    assert len(partial) == 64 and round(2 * math.pi / float(partial.min())) == 5063256
    x = torch.randn(1, 1, 5, 512)
    rotated = posenc.Rope(512, 1e6, rope_type="proportional", partial_rotary_factor=0.25).transform_qk(x, range(5))
    still = torch.cat((torch.arange(64, 256), torch.arange(320, 512)))
    assert torch.equal(rotated[..., still], x[..., still])  # pairs past the fraction never turn
    with pytest.raises(ValueError, match="partial_rotary_factor must be in \\[0, 1\\]"):
        rope_frequencies(64, rope_type="proportional", partial_rotary_factor=1.5)


@pytest.mark.parametrize(
    "rope_type, params, head_dim, base, kept",
    [  # Llama 4 Scout and Kimi K2-Instruct-0905: hard cuts at one turn in the original context
        ("llama3", {"factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}, 128, 5e5, 35),
        ("yarn", {"factor": 64.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}, 64, 5e4, 20),
    ],
)
def test_hard_cut_bands_keep_the_fast_pairs_and_divide_the_rest(rope_type, params, head_dim, base, kept):
    inv_freq, factor = rope_frequencies(head_dim, base, rope_type, "transformers", **params)
    plain, _ = rope_frequencies(head_dim, base, numerics="transformers")
    assert factor == 1.0 and int((inv_freq == plain).sum()) == kept
    torch.testing.assert_close(inv_freq[kept:], plain[kept:] / params["factor"], rtol=1e-6, atol=0)
    hf = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    config = LlamaConfig(head_dim=head_dim, rope_parameters={"rope_type": rope_type, "rope_theta": base, **params}, max_position_embeddings=1 << 20)
    expected, hf_factor = hf.ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    assert torch.equal(inv_freq, expected) and hf_factor == factor


def test_bands_that_cross_are_still_refused():
    with pytest.raises(ValueError, match="low_freq_factor must not exceed high_freq_factor"):
        rope_frequencies(64, rope_type="llama3", factor=8.0, original_max_position_embeddings=8192, low_freq_factor=4.0, high_freq_factor=2.0)
    with pytest.raises(ValueError, match="beta_fast must not be below beta_slow"):
        rope_frequencies(64, rope_type="yarn", factor=4.0, original_max_position_embeddings=4096, beta_fast=1.0, beta_slow=32.0)


def test_packed_gives_positions_and_documents_from_cu_seqlens():
    positions, documents = packed([0, 3, 7, 8])
    assert positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 0] and documents.tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    for bad in ([3, 7], [0, 3, 3], [[0, 2]]):
        with pytest.raises(ValueError, match="cu_seqlens must be increasing"):
            packed(bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_queries_from_several_packed_documents_decode_together(backend):
    positions, documents = packed([0, 4, 9, 12])
    q, k, v = qkv(1, 4, 12)
    scheme = with_sinks(posenc.Rope(8))
    full = posenc.attention(q, k, v, scheme, q_positions=positions, k_positions=positions)
    last = torch.tensor([3, 8, 11])  # the newest token of each document
    kwargs = dict(q_positions=positions[last], k_positions=positions, q_documents=documents[last], k_documents=documents, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(posenc.attention(q[:, :, last], k, v, scheme, **kwargs), full[:, :, last], atol=2e-6, rtol=2e-6)
    with pytest.raises(ValueError, match="q_positions must be the\\s+last q_len"):
        posenc.attention(q[:, :, last], k, v, scheme, q_positions=positions[last], k_positions=positions)


def test_a_cache_of_packed_documents_decodes_each_document_in_its_own_rows():
    positions, documents = packed([0, 5, 11])
    q, k, v = qkv(1, 4, 11)
    scheme = posenc.SlidingWindow(3, posenc.Rope(8))
    full = posenc.attention(q, k, v, scheme, q_positions=positions, k_positions=positions)
    cache = posenc.KVCache(scheme)
    steps = [cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], positions[t : t + 1], documents=documents[t : t + 1]) for t in range(11)]
    torch.testing.assert_close(torch.cat(steps, 2), full)
    with pytest.raises(ValueError, match="the queries need theirs"):
        cache.attend(q[:, :, :1], [6])
    with pytest.raises(ValueError, match="q_documents and k_documents go together"):
        posenc.attention(q, k, v, scheme, q_documents=documents)


def test_a_tiny_model_takes_one_scheme_per_layer_and_decodes_through_its_caches():
    torch.manual_seed(0)
    rope = posenc.Rope(16)
    schemes = [with_sinks(rope, sliding_window(3)), Layer(rope, chunked(4)), Layer(temperature=LogFloorTemperature(0.3, 4, 1.0))]
    model = posenc.TinyTransformer(40, 64, 4, scheme=schemes)
    assert len(model.blocks) == 3 and model.layer_schemes()[0] is schemes[0]
    tokens = torch.randint(0, 40, (2, 11))
    caches = posenc.KVCache.for_layers(model.layer_schemes())
    steps = [model(tokens[:, t : t + 1], positions=[t], caches=caches) for t in range(11)]
    torch.testing.assert_close(torch.cat(steps, 1), model(tokens), atol=1e-5, rtol=1e-5)
    assert [len(c) for c in caches] == [3, 11, 11]
    posenc.train(model, lambda step: (tokens[:, :-1], tokens[:, 1:]), steps=2)
    assert schemes[0].sinks.grad is not None  # the sink logits are the model's parameters


def test_a_per_layer_list_is_checked_by_name():
    with pytest.raises(TypeError, match="layer 1 is 'linear_attention', not a posenc scheme"):
        posenc.TinyTransformer(10, 16, 2, scheme=[posenc.Rope(8), "linear_attention"])
    with pytest.raises(ValueError, match="input-hook scheme"):
        posenc.TinyTransformer(10, 16, 2, scheme=[posenc.Sinusoidal(16)])
    with pytest.raises(ValueError, match="sink logits for 4 heads, but the model has num_heads=2"):
        posenc.TinyTransformer(10, 16, 2, scheme=[Layer(sinks=4)])
    with pytest.raises(TypeError, match="layer 0 is 'mamba', not an attention scheme"):
        posenc.KVCache.for_layers(["mamba"])
