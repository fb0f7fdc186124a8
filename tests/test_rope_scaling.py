import importlib.util
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hf_reference as ref
import posenc
from posenc.qk import rope_scaling
from posenc.qk import rope as qk_rope
from posenc import core

HAVE_HF = importlib.util.find_spec("transformers") is not None
SOURCES = ["frozen", pytest.param("live", marks=pytest.mark.skipif(not HAVE_HF, reason="transformers not installed"))]


@pytest.fixture(scope="module", params=SOURCES)
def hf(request):
    return ref.frozen()["rope_scaling"] if request.param == "frozen" else {ref.scaling_case_id(c): [v.tolist(), f] for c in ref.ROPE_SCALING_CASES for v, f in [ref.rope_scaled(*c)]}


@pytest.mark.parametrize("case", ref.ROPE_SCALING_CASES, ids=ref.scaling_case_id)
def test_every_rope_type_agrees_with_hugging_face(hf, case):
    rope_type, head_dim, base, params, max_len, seq_len = case
    extra = {}
    if rope_type == "dynamic":
        extra = {"max_position_embeddings": max_len, "seq_len": seq_len}
    if rope_type == "yarn" and "factor" not in params:
        extra = {"max_position_embeddings": max_len}
    if rope_type == "longrope":  # the factor from the two lengths where it is not given; the current length picks short or long
        extra = ({} if "factor" in params else {"max_position_embeddings": max_len}) | ({} if seq_len is None else {"seq_len": seq_len})
    inv_freq, factor = posenc.rope_frequencies(head_dim, base, rope_type, **params, **extra)
    expected_freq, expected_factor = hf[ref.scaling_case_id(case)]
    expected_freq = torch.tensor(expected_freq, dtype=torch.float32)
    torch.testing.assert_close(inv_freq, expected_freq, atol=0, rtol=2e-6)
    assert factor == pytest.approx(expected_factor, rel=1e-12)
    # numerics="transformers" reproduces transformers' float32 arithmetic bit for bit
    exact, exact_factor = posenc.rope_frequencies(head_dim, base, rope_type, numerics="transformers", **params, **extra)
    assert torch.equal(exact, expected_freq) and exact_factor == expected_factor
    rope = posenc.Rope(head_dim, base, rope_type=rope_type, numerics="transformers", **params, **extra)
    assert torch.equal(rope.inv_freq, expected_freq)


@pytest.mark.parametrize("head_dim, base", ref.ROPE_CASES)
def test_default_frequencies_with_transformers_numerics_are_llamas_bit_for_bit(head_dim, base):
    expected = torch.tensor(ref.frozen()["rope_inv_freq"][f"{head_dim}@{base:g}"], dtype=torch.float32)
    assert torch.equal(posenc.rope_frequencies(head_dim, base, numerics="transformers")[0], expected)
    default = posenc.rope_frequencies(head_dim, base)[0]
    ulps = ((default.double() - expected.double()).abs() / torch.finfo(torch.float32).eps / expected.double()).max()
    assert ulps <= 4  # the float64 default is a few float32 ulps from transformers' float32 arithmetic


FACTOR_ONE = {
    "linear": {},
    "ntk": {},
    "dynamic": {"max_position_embeddings": 512, "seq_len": 512},  # see test_dynamic_at_factor_one_still_follows_the_length
    "yarn": {"original_max_position_embeddings": 512},
    "llama3": {"original_max_position_embeddings": 512},
    "longrope": {"original_max_position_embeddings": 512, "short_factor": "ones", "long_factor": "ones"},  # ones: one per pair
    "proportional": {"partial_rotary_factor": 1.0},  # the whole ladder turns
}


def test_every_scaling_type_is_covered():
    assert set(FACTOR_ONE) | {"default"} == set(posenc.ROPE_TYPES)


@settings(max_examples=40, deadline=None)
@given(rope_type=st.sampled_from(sorted(FACTOR_ONE)), half=st.integers(2, 128), base=st.floats(10.0, 1e7))
def test_every_rope_type_reduces_to_plain_rope_at_factor_one(rope_type, half, base):
    head_dim = 2 * half
    plain, _ = posenc.rope_frequencies(head_dim, base)
    params = {k: [1.0] * half if v == "ones" else v for k, v in FACTOR_ONE[rope_type].items()}
    scaled, attention_factor = posenc.rope_frequencies(head_dim, base, rope_type, factor=1.0, **params)
    torch.testing.assert_close(scaled, plain, atol=0, rtol=1e-6)
    assert attention_factor == 1.0


def test_dynamic_at_factor_one_still_follows_the_length():
    """HF's (and emozilla's) formula at factor 1 is base * (seq_len / max)^(d / (d - 2)): plain only within max."""
    plain, _ = posenc.rope_frequencies(64)
    past, _ = posenc.rope_frequencies(64, rope_type="dynamic", factor=1.0, max_position_embeddings=512, seq_len=1024)
    expected, _ = posenc.rope_frequencies(64, 10000.0 * 2 ** (64 / 62))
    torch.testing.assert_close(past, expected)
    assert not torch.equal(past, plain)


def test_linear_is_positions_divided_by_the_factor():
    inv_freq, _ = posenc.rope_frequencies(64, rope_type="linear", factor=4.0)
    plain, _ = posenc.rope_frequencies(64)
    x = torch.randn(1, 1, 8, 64)
    positions = torch.arange(0, 8000, 1000)
    torch.testing.assert_close(posenc.apply_rope(x, positions, inv_freq), posenc.apply_rope(x, positions / 4.0, plain), atol=2e-3, rtol=0)


def test_ntk_keeps_the_highest_frequency_and_divides_the_lowest_by_the_factor():
    plain, _ = posenc.rope_frequencies(128)
    ntk, _ = posenc.rope_frequencies(128, rope_type="ntk", factor=8.0)
    assert ntk[0] == plain[0]
    assert ntk[-1].item() == pytest.approx(plain[-1].item() / 8.0, rel=1e-5)
    ratio = plain / ntk
    assert bool((ratio[1:] >= ratio[:-1]).all())  # stretched more and more towards the low frequencies


def test_dynamic_follows_the_length_and_is_plain_within_it():
    plain, _ = posenc.rope_frequencies(64)
    within, _ = posenc.rope_frequencies(64, rope_type="dynamic", factor=4.0, max_position_embeddings=1024, seq_len=1000)
    past, _ = posenc.rope_frequencies(64, rope_type="dynamic", factor=4.0, max_position_embeddings=1024, seq_len=3000)
    assert torch.equal(within, plain) and bool((past[1:] < plain[1:]).all())


def test_dynamic_ntk_with_a_kv_cache_is_not_one_full_pass():
    """The trap: cached keys were rotated under the base of their step, the full pass rotates all under the last one."""
    torch.manual_seed(0)
    rope = posenc.Rope(16, rope_type="dynamic", factor=4.0, max_position_embeddings=8)
    q, k, v = torch.randn(3, 1, 2, 20, 16)
    full = posenc.attention(q, k, v, rope)
    cache = posenc.KVCache(rope)
    steps = []
    for t in range(20):
        cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1], [t])
        steps.append(cache.attend(q[:, :, t : t + 1], [t]))
    steps = torch.cat(steps, 2)
    # within max_position_embeddings a cache and a full pass agree
    torch.testing.assert_close(steps[:, :, :8], posenc.attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], rope))
    # past it they do not: the full pass rotates every key with the base of length 20
    assert (steps - full).abs().max() > 1e-2


@settings(max_examples=30, deadline=None)
@given(half=st.integers(8, 64), factor=st.floats(1.5, 64.0), beta_fast=st.floats(8.0, 64.0), beta_slow=st.floats(0.5, 2.0), truncate=st.booleans())
def test_yarn_ramp_is_continuous_and_monotone(half, factor, beta_fast, beta_slow, truncate):
    head_dim = 2 * half
    ramp = rope_scaling.yarn_ramp(head_dim, 10000.0, 4096, beta_fast, beta_slow, truncate)
    assert bool((ramp[1:] >= ramp[:-1]).all()) and float(ramp.min()) >= 0 and float(ramp.max()) <= 1
    low = max(math.floor(rope_scaling.yarn_correction_dim(beta_fast, head_dim, 10000.0, 4096)) if truncate else rope_scaling.yarn_correction_dim(beta_fast, head_dim, 10000.0, 4096), 0)
    high = min(math.ceil(rope_scaling.yarn_correction_dim(beta_slow, head_dim, 10000.0, 4096)) if truncate else rope_scaling.yarn_correction_dim(beta_slow, head_dim, 10000.0, 4096), head_dim - 1)
    width = max(high - low, 1e-3)
    assert float((ramp[1:] - ramp[:-1]).max()) <= 1 / width + 1e-5  # no jump larger than one ramp step
    inv_freq, _ = posenc.rope_frequencies(head_dim, rope_type="yarn", factor=factor, original_max_position_embeddings=4096, beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate)
    plain, _ = posenc.rope_frequencies(head_dim)
    expected = plain.double() / factor * ramp.double() + plain.double() * (1 - ramp.double())
    torch.testing.assert_close(inv_freq.double(), expected, atol=0, rtol=1e-6)


def test_yarn_temperature_is_applied_once_to_cos_and_sin():
    inv_freq, mscale = posenc.rope_frequencies(64, rope_type="yarn", factor=16.0, original_max_position_embeddings=4096)
    assert mscale == pytest.approx(0.1 * math.log(16.0) + 1)
    q, k = torch.randn(2, 1, 1, 1, 64)
    rope = posenc.Rope(64, rope_type="yarn", factor=16.0, original_max_position_embeddings=4096)
    logit = core.attention_logits(q, k, rope, torch.tensor([5]), torch.tensor([2]), 1.0)
    unscaled = posenc.apply_rope(q, [5], inv_freq) @ posenc.apply_rope(k, [2], inv_freq).transpose(-1, -2)
    torch.testing.assert_close(logit, unscaled * mscale**2)  # once on q and once on k: the logit gets its square


@settings(max_examples=30, deadline=None)
@given(low=st.floats(0.5, 4.0), gap=st.floats(0.5, 8.0), factor=st.floats(1.5, 32.0))
def test_llama3_blend_is_continuous_at_its_band_edges(low, gap, factor):
    high, original = low + gap, 8192
    inv_freq, _ = posenc.rope_frequencies(128, 500000.0, "llama3", factor=factor, original_max_position_embeddings=original, low_freq_factor=low, high_freq_factor=high)
    plain, _ = posenc.rope_frequencies(128, 500000.0)
    wavelength = 2 * math.pi / plain.double()
    short, long = wavelength < original / high, wavelength > original / low
    torch.testing.assert_close(inv_freq[short], plain[short])
    torch.testing.assert_close(inv_freq[long], plain[long] / factor)
    # the blend, written as a function of original / wavelength, meets both bands at their edges
    exact = rope_scaling.default_inv_freq(128, 500000.0)  # float64: the float32 frequencies would blur the ratio
    ratio = original / (2 * math.pi / exact)
    blend = lambda r: ((1 - (r - low) / (high - low)) / factor + (r - low) / (high - low))  # noqa: E731
    assert blend(torch.tensor(high)).item() == pytest.approx(1.0) and blend(torch.tensor(low)).item() == pytest.approx(1 / factor)
    medium = ~short & ~long
    torch.testing.assert_close(inv_freq[medium].double(), exact[medium] * blend(ratio[medium]), atol=0, rtol=1e-6)


@pytest.mark.parametrize("call, words", [
    (lambda: posenc.rope_frequencies(64, rope_type="linear", factor=0.5), "factor must be a finite number >= 1.0"),
    (lambda: posenc.rope_frequencies(64, rope_type="linear"), "rope_type 'linear' needs factor"),
    (lambda: posenc.rope_frequencies(64, rope_type="ntk", factor=0.9), "factor must be a finite number >= 1.0"),
    (lambda: posenc.rope_frequencies(64, rope_type="dynamic", factor=2.0), "rope_type 'dynamic' needs max_position_embeddings"),
    (lambda: posenc.rope_frequencies(64, rope_type="yarn", factor=4.0), "rope_type 'yarn' needs original_max_position_embeddings"),
    (lambda: posenc.rope_frequencies(64, rope_type="yarn", original_max_position_embeddings=4096), "needs factor, or max_position_embeddings"),
    (lambda: posenc.rope_frequencies(64, rope_type="yarn", factor=4.0, original_max_position_embeddings=4096, beta_fast=1.0, beta_slow=2.0), "beta_fast must not be below beta_slow"),
    (lambda: posenc.rope_frequencies(64, rope_type="llama3", factor=8.0), "rope_type 'llama3' needs original_max_position_embeddings"),
    (lambda: posenc.rope_frequencies(64, rope_type="llama3", factor=8.0, original_max_position_embeddings=8192, low_freq_factor=4.0, high_freq_factor=2.0), "low_freq_factor must not exceed high_freq_factor"),
    (lambda: posenc.rope_frequencies(64, rope_type="llama3", factor=8.0, original_max_position_embeddings=8192, beta_fast=3.0), "does not accept ['beta_fast']"),
    (lambda: posenc.Rope(64, rope_type="linear", factor=0.5), "factor must be a finite number >= 1.0"),
])
def test_bad_scaling_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)


def test_rope_parameters_lists_hugging_face_names():
    assert set(qk_rope.rope_parameters("yarn")) == {
        "original_max_position_embeddings", "factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate", "max_position_embeddings",
    }
    assert set(qk_rope.rope_parameters("llama3")) == {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}
