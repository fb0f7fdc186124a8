import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernel import bias_matrix
from posenc.score.masks import causal, mask_matrix


def test_eight_heads_are_powers_of_one_half():
    assert torch.equal(posenc.alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))


@pytest.mark.parametrize("n", [1, 2, 4, 16, 32, 64, 128])
def test_power_of_two_heads_form_a_geometric_sequence(n):
    slopes = posenc.alibi_slopes(n).double()
    expected = torch.tensor([2 ** (-8 * (i + 1) / n) for i in range(n)], dtype=torch.float64)
    assert torch.allclose(slopes, expected, rtol=1e-7)


@pytest.mark.parametrize("n", [3, 12, 100, 256])
def test_slopes_are_the_float64_formula_rounded_once(n):
    p = 2 ** math.floor(math.log2(n))
    exact = [2 ** (-8 * (i + 1) / p) for i in range(p)] + [2 ** (-8 * (i + 1) / (2 * p)) for i in range(0, 2 * (n - p), 2)]
    assert torch.equal(posenc.alibi_slopes(n), torch.tensor(exact, dtype=torch.float64).float())


def test_twelve_heads_interleave_the_extra_slopes():
    # the 8 slopes of h=8, then every other slope of h=16 (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5)
    expected = [2.0**-i for i in range(1, 9)] + [2 ** -(0.5 + i) for i in range(4)]
    assert torch.allclose(posenc.alibi_slopes(12).double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-7)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300))
def test_slopes_are_distinct_and_between_zero_and_one(n):
    s = posenc.alibi_slopes(n)
    assert s.shape == (n,)
    assert bool((s > 0).all()) and bool((s < 1).all())
    assert len(set(s.tolist())) == n
    assert s.min().item() == 2.0**-8  # the shallowest slope is always 2^-8


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(0, 10**6), length=st.integers(1, 16))
def test_bias_is_the_same_whatever_the_absolute_offset(offset, length):
    alibi = posenc.ALiBi(4)
    pos = torch.arange(length)
    assert torch.equal(bias_matrix(alibi, pos, pos), bias_matrix(alibi, pos + offset, pos + offset))


def test_bias_is_minus_slope_times_distance():
    slopes = posenc.alibi_slopes(2)
    bias = bias_matrix(posenc.ALiBi(2), torch.arange(4), torch.arange(4))
    assert bias.shape == (2, 4, 4)
    assert bias[0, 3, 0].item() == -3 * slopes[0].item()
    assert bias[1, 2, 2].item() == 0.0


def test_key_only_bias_gives_the_same_causal_weights():
    """BLOOM adds m_h * j (key position only): per-row constants cancel in the softmax."""
    torch.manual_seed(0)
    heads, length = 4, 9
    q, k, v = torch.randn(3, 1, heads, length, 8)
    scheme = posenc.ALiBi(heads)
    _, weights = posenc.attention(q, k, v, scheme, return_weights=True)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + scheme.slopes[:, None, None] * torch.arange(length)
    scores = scores.masked_fill(~mask_matrix(causal, torch.arange(length), torch.arange(length)), float("-inf"))
    assert torch.allclose(weights, scores.softmax(-1), atol=1e-6)
