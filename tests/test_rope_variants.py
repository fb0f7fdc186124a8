"""LongRoPE, partial rotary dimensions and xPos: the RoPE variants current checkpoints ship."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import core
from posenc.qk import rope_scaling
from posenc.qk.xpos import xpos_zeta

SHORT = [1.0 + 0.05 * i for i in range(8)]
LONG = [1.0 + 2.0 * i for i in range(8)]
LONGROPE = {"short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 32, "max_position_embeddings": 128}


# --- LongRoPE ---------------------------------------------------------------------------------------------------


def test_longrope_divides_each_pair_by_its_short_or_long_factor():
    plain, _ = posenc.rope_frequencies(16)
    short, factor = posenc.rope_frequencies(16, rope_type="longrope", **LONGROPE)
    at_original, _ = posenc.rope_frequencies(16, rope_type="longrope", seq_len=32, **LONGROPE)
    past, _ = posenc.rope_frequencies(16, rope_type="longrope", seq_len=33, **LONGROPE)
    torch.testing.assert_close(short.double(), plain.double() / torch.tensor(SHORT, dtype=torch.float64), atol=0, rtol=1e-6)
    assert torch.equal(at_original, short)  # up to original_max_position_embeddings the short factors hold
    torch.testing.assert_close(past.double(), plain.double() / torch.tensor(LONG, dtype=torch.float64), atol=0, rtol=1e-6)
    assert factor == pytest.approx(math.sqrt(1 + math.log(128 / 32) / math.log(32)))  # factor = max / original


def test_longrope_attention_factor_is_given_or_from_the_factor():
    params = {k: v for k, v in LONGROPE.items() if k != "max_position_embeddings"}
    assert posenc.rope_frequencies(16, rope_type="longrope", factor=8.0, **params)[1] == pytest.approx(math.sqrt(1 + math.log(8) / math.log(32)))
    assert posenc.rope_frequencies(16, rope_type="longrope", factor=8.0, attention_factor=1.3, **params)[1] == 1.3
    assert posenc.rope_frequencies(16, rope_type="longrope", factor=1.0, **params)[1] == 1.0


def test_longrope_scheme_switches_with_the_length_of_the_call():
    rope = posenc.Rope(16, rope_type="longrope", **LONGROPE)
    assert rope.follows_length
    x = torch.randn(1, 2, 40, 16)
    for length, which in ((32, SHORT), (40, LONG)):
        inv_freq = posenc.rope_frequencies(16)[0].double() / torch.tensor(which, dtype=torch.float64)
        expected = posenc.apply_rope(x[:, :, :length], torch.arange(length), inv_freq.float(), attention_factor=rope.attention_factor)
        torch.testing.assert_close(rope.transform_qk(x[:, :, :length], range(length)), expected)
        torch.testing.assert_close(rope.transform_qk(x[:, :, :length], torch.arange(length)), expected)


def test_longrope_with_a_kv_cache_is_not_one_full_pass():
    """The trap dynamic NTK has: keys cached under the short factors stay so when the stream passes the original length."""
    torch.manual_seed(0)
    rope = posenc.Rope(16, rope_type="longrope", **LONGROPE)
    q, k, v = torch.randn(3, 1, 2, 40, 16)
    cache, steps = posenc.KVCache(rope), []
    for t in range(40):
        steps.append(cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], [t]))
    steps = torch.cat(steps, 2)
    within = posenc.attention(q[:, :, :32], k[:, :, :32], v[:, :, :32], rope)
    torch.testing.assert_close(steps[:, :, :32], within)  # within the original length: the same short factors
    assert (steps[:, :, 32:] - posenc.attention(q, k, v, rope)[:, :, 32:]).abs().max() > 1e-2
    # a fixed seq_len pins one set of factors: then decoding is one full pass again
    pinned = posenc.Rope(16, rope_type="longrope", seq_len=64, **LONGROPE)
    assert not pinned.follows_length
    cache = posenc.KVCache(pinned)
    steps = torch.cat([cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], [t]) for t in range(40)], 2)
    torch.testing.assert_close(steps, posenc.attention(q, k, v, pinned))


@pytest.mark.parametrize("call, words", [
    (lambda: posenc.rope_frequencies(16, rope_type="longrope", original_max_position_embeddings=32, factor=4.0), "needs long_factor, short_factor"),
    (lambda: posenc.rope_frequencies(16, rope_type="longrope", short_factor=[1.0] * 7, long_factor=LONG, original_max_position_embeddings=32, factor=4.0), "short_factor must have head_dim / 2 = 8 entries"),
    (lambda: posenc.rope_frequencies(16, rope_type="longrope", short_factor=SHORT, long_factor=LONG[:-1] + [0.0], original_max_position_embeddings=32, factor=4.0), "long_factor[7] must be a finite number > 0"),
    (lambda: posenc.rope_frequencies(16, rope_type="longrope", short_factor=SHORT, long_factor=LONG, factor=4.0), "rope_type 'longrope' needs original_max_position_embeddings"),
    (lambda: posenc.rope_frequencies(16, rope_type="longrope", short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=32), "needs factor, or max_position_embeddings"),
    (lambda: posenc.rope_frequencies(16, rope_type="longrope", short_factor="1.0", long_factor=LONG, original_max_position_embeddings=32, factor=2.0), "short_factor must be a list"),
])
def test_bad_longrope_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)


# --- partial rotary dimensions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", posenc.LAYOUTS)
@pytest.mark.parametrize("factor", [0.25, 0.4, 0.5, 1.0])
def test_partial_rotation_turns_the_first_part_and_passes_the_rest(layout, factor):
    x = torch.randn(2, 3, 7, 80)
    rotated = int(80 * factor)
    inv_freq, _ = posenc.rope_frequencies(80, partial_rotary_factor=factor)
    assert inv_freq.shape == (rotated // 2,)
    y = posenc.apply_rope(x, torch.arange(100, 107), inv_freq, layout, partial_rotary_factor=factor)
    assert torch.equal(y[..., rotated:], x[..., rotated:])
    assert torch.equal(y[..., :rotated], posenc.apply_rope(x[..., :rotated], torch.arange(100, 107), inv_freq, layout))
    rope = posenc.Rope(80, layout=layout, partial_rotary_factor=factor)
    assert torch.equal(rope.transform_qk(x, torch.arange(100, 107)), y)
    assert torch.equal(rope.transform_qk(x, range(7)), posenc.apply_rope(x, torch.arange(7), inv_freq, layout, partial_rotary_factor=factor))


@settings(max_examples=40, deadline=None)
@given(
    rope_type=st.sampled_from(["default", "linear", "ntk", "dynamic", "yarn", "llama3"]),
    head_dim=st.sampled_from([32, 64, 80, 96, 128, 256]),
    factor=st.sampled_from([0.25, 0.4, 0.5, 0.75, 1.0]),
)
def test_every_schedule_of_a_partial_head_is_the_schedule_of_its_rotated_width(rope_type, head_dim, factor):
    """Hugging Face's rule: dim = int(head_dim * partial_rotary_factor) replaces head_dim everywhere (NTK exponent, YaRN range)."""
    rotated = int(head_dim * factor)
    if rotated % 2 or rotated < 4:
        return
    params = {
        "default": {}, "linear": {"factor": 4.0}, "ntk": {"factor": 4.0},
        "dynamic": {"factor": 4.0, "max_position_embeddings": 512, "seq_len": 2048},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 512},
        "llama3": {"factor": 4.0, "original_max_position_embeddings": 512},
    }[rope_type]
    partial = posenc.rope_frequencies(head_dim, 10000.0, rope_type, partial_rotary_factor=factor, **params)
    whole = posenc.rope_frequencies(rotated, 10000.0, rope_type, **params)
    assert torch.equal(partial[0], whole[0]) and partial[1] == whole[1]


def test_partial_rotation_changes_the_ntk_exponent_and_the_yarn_range():
    full, _ = posenc.rope_frequencies(128, rope_type="ntk", factor=8.0)
    quarter, _ = posenc.rope_frequencies(128, rope_type="ntk", factor=8.0, partial_rotary_factor=0.25)
    assert quarter[-1].item() == pytest.approx(posenc.rope_frequencies(32)[0][-1].item() / 8, rel=1e-5)  # lowest of 32 dims / 8
    assert rope_scaling.ntk_base(32, 1e4, 8.0) > rope_scaling.ntk_base(128, 1e4, 8.0)  # d / (d - 2) grows as d shrinks
    assert len(quarter) == 16 and len(full) == 64
    low32 = math.floor(rope_scaling.yarn_correction_dim(32, 32, 1e4, 4096))
    low128 = math.floor(rope_scaling.yarn_correction_dim(32, 128, 1e4, 4096))
    assert low32 < low128  # the same fast/slow boundary falls at another pair index when fewer dimensions rotate


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 5000), n=st.integers(0, 5000), shift=st.integers(0, 5000), layout=st.sampled_from(posenc.LAYOUTS))
def test_partial_rotation_keeps_the_relative_property(m, n, shift, layout):
    q, k = torch.randn(2, 1, 1, 1, 40, generator=torch.Generator().manual_seed(m + 7 * n), dtype=torch.float64)
    rope = posenc.Rope(40, layout=layout, partial_rotary_factor=0.4)

    def logit(i, j):  # float64 angles and products: exact up to rounding
        return float((rope.transform_qk(q, torch.tensor([i])) * rope.transform_k(k, torch.tensor([j]))).sum())

    assert math.isclose(logit(m, n), logit(m + shift, n + shift), rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("call, words", [
    (lambda: posenc.rope_frequencies(64, partial_rotary_factor=0.3), "int(64 * 0.3) = 19 dimensions of each head: it must be an even number"),
    (lambda: posenc.rope_frequencies(64, partial_rotary_factor=1.5), "partial_rotary_factor must be in (0, 1]"),
    (lambda: posenc.rope_frequencies(64, partial_rotary_factor=0.0), "partial_rotary_factor must be a finite number > 0"),
    (lambda: posenc.rope_frequencies(64, partial_rotary_factor=0.01), "it must be an even number >= 2"),
    (lambda: posenc.apply_rope(torch.randn(3, 64), torch.arange(3), posenc.rope_frequencies(64)[0], partial_rotary_factor=0.5), "inv_freq has last dimension 32, but partial_rotary_factor=0.5 of head_dim 64 (rotating 32) needs 16"),
    (lambda: posenc.Rope(64, partial_rotary_factor=0.5).transform_qk(torch.randn(1, 1, 3, 32), range(3)), "x has last dimension 32, but Rope(head_dim=64) needs 64"),
])
def test_bad_partial_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)


# --- xPos -------------------------------------------------------------------------------------------------------


def test_xpos_zeta_is_the_papers():
    d = 64
    assert torch.allclose(xpos_zeta(d), (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d))  # torchscale's form
    assert float(xpos_zeta(d).max()) < 1 and float(xpos_zeta(d).min()) == pytest.approx(0.4 / 1.4)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 4000), n=st.integers(0, 4000), shift=st.integers(-4000, 4000), layout=st.sampled_from(posenc.LAYOUTS), seed=st.integers(0, 1000))
def test_xpos_logits_depend_only_on_m_minus_n(m, n, shift, layout, seed):
    q, k = torch.randn(2, 1, 1, 1, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    xpos = posenc.XPos(32, layout=layout)

    def logit(i, j):  # in float64 throughout (attention_logits would round to float32)
        return float((xpos.transform_qk(q, torch.tensor([i])) * xpos.transform_k(k, torch.tensor([j]))).sum())

    assert math.isclose(logit(m, n), logit(m + shift, n + shift), rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("layout", posenc.LAYOUTS)
def test_xpos_is_rope_with_each_pair_damped_by_zeta_to_the_distance(layout):
    torch.manual_seed(0)
    d, s = 16, 512.0
    q, k = torch.randn(2, 16, d, dtype=torch.float64)
    m, n = torch.arange(100, 116), torch.arange(16)
    xpos, inv_freq = posenc.XPos(d, layout=layout), posenc.rope_frequencies(d)[0]
    got = xpos.transform_qk(q, m) * xpos.transform_k(k, n)  # elementwise products of matching dimensions
    rope = posenc.apply_rope(q, m, inv_freq, layout) * posenc.apply_rope(k, n, inv_freq, layout)
    damp = xpos_zeta(d)[None, :] ** ((m - n)[:, None] / s)  # per pair; m - n = 100 for every row
    damp = torch.cat((damp, damp), -1) if layout == "half" else damp.repeat_interleave(2, -1)
    torch.testing.assert_close(got.sum(-1), (rope * damp).sum(-1))
    assert torch.allclose(xpos.transform_qk(q, torch.zeros(16)), q) and torch.allclose(xpos.transform_k(k, torch.zeros(16)), k)


def test_xpos_logit_of_a_query_after_its_key_decays_with_distance():
    """For q = k = ones the logit at distance r is sum_i 2 zeta_i^(r/s) cos(r theta_i): bounded by an envelope that falls with r."""
    d = 32
    xpos = posenc.XPos(d)
    u = torch.ones(1, 1, 1, d, dtype=torch.float64)
    r = torch.arange(0, 4096, 64)
    logits = torch.stack([core.attention_logits(u, u, xpos, torch.tensor([int(i)]), torch.tensor([0]), 1.0).flatten() for i in r]).flatten()
    envelope = 2 * (xpos_zeta(d)[None, :] ** (r[:, None] / 512.0)).sum(-1)
    assert bool((logits.abs() <= envelope + 1e-9).all()) and bool((envelope[1:] < envelope[:-1]).all())
    assert envelope[-1] < envelope[0] / 4


def test_xpos_positions_must_stay_in_the_range_of_the_dtype():
    xpos = posenc.XPos(16)
    x = torch.randn(1, 1, 2, 16)
    xpos.transform_k(x, torch.tensor([20000, 20001]))  # float32: fine
    with pytest.raises(ValueError, match="shift q and k positions by the same offset"):
        xpos.transform_k(x, torch.tensor([10**6, 10**6 + 1]))
    with pytest.raises(ValueError, match="torch.float16"):
        xpos.transform_k(x.half(), torch.tensor([20000, 20001]))
    # shifting both sides keeps the logits: the way out the message names
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    near = core.attention_logits(q, x[:, :, :1].double(), xpos, torch.tensor([5]), torch.tensor([0]), 1.0)
    shifted = core.attention_logits(q, x[:, :, :1].double(), xpos, torch.tensor([-995]), torch.tensor([-1000]), 1.0)
    torch.testing.assert_close(near, shifted)
