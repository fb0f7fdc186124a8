import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.input import sinusoidal


def formula(p: float, c: int, dim: int, base: float = 10000.0) -> float:
    """PE[p, c] straight from the paper, in Python floats (float64)."""
    angle = p / base ** (2 * (c // 2) / dim)
    return math.sin(angle) if c % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("dim", [2, 8, 64, 512, 7])
def test_matches_the_formula_to_1e6_up_to_position_1e5(dim):
    positions = torch.tensor([0, 1, 2, 17, 999, 12345, 99999, 100000])
    table = posenc.sinusoidal_encoding(positions, dim)
    expected = torch.tensor([[formula(float(p), c, dim) for c in range(dim)] for p in positions.tolist()])
    assert table.shape == (len(positions), dim)
    assert table.dtype == torch.float32
    assert (table.double() - expected).abs().max() < 1e-6


def test_position_zero_is_zero_one_interleaved():
    assert torch.equal(posenc.sinusoidal_encoding(0, 6), torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))


def test_shape_follows_positions():
    assert posenc.sinusoidal_encoding(torch.zeros(3, 5, dtype=torch.long), 4).shape == (3, 5, 4)
    assert posenc.sinusoidal_encoding([1, 2], 4, dtype=torch.float64).dtype == torch.float64


def test_real_positions_are_accepted():
    assert torch.allclose(posenc.sinusoidal_encoding(torch.tensor([0.5]), 2)[0, 0], torch.tensor(math.sin(0.5)))


def test_wavelengths_are_geometric_from_2pi_to_2pi_base():
    w = sinusoidal.sinusoidal_wavelengths(128)
    assert w.shape == (64,)
    assert math.isclose(w[0].item(), 2 * math.pi)
    ratio = w[1:] / w[:-1]
    assert torch.allclose(ratio, ratio[0].expand_as(ratio))
    assert math.isclose(w[-1].item(), 2 * math.pi * 10000 ** (126 / 128), rel_tol=1e-12)


@settings(max_examples=50, deadline=None)
@given(p=st.integers(0, 5000), k=st.integers(-500, 500), half=st.integers(1, 32))
def test_shift_by_k_is_a_fixed_rotation(p, k, half):
    dim = 2 * half
    m = sinusoidal.shift_rotation(k, dim)
    pe = posenc.sinusoidal_encoding(torch.tensor([p, p + k]), dim, dtype=torch.float64)
    assert torch.allclose(m @ pe[0], pe[1], atol=1e-9)
    assert torch.allclose(m @ m.T, torch.eye(dim, dtype=torch.float64), atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(0, 10000), q=st.integers(0, 10000), k=st.integers(0, 1000))
def test_dot_product_depends_only_on_the_offset(p, q, k):
    pe = posenc.sinusoidal_encoding(torch.tensor([p, p + k, q, q + k]), 32, dtype=torch.float64)
    assert math.isclose((pe[0] @ pe[1]).item(), (pe[2] @ pe[3]).item(), abs_tol=1e-9)


def test_scheme_embeds_the_table():
    s = posenc.Sinusoidal(16)
    assert s.hook == "input"
    assert torch.equal(s.embed(torch.arange(5)), posenc.sinusoidal_encoding(torch.arange(5), 16))


def test_float32_angles_at_large_positions_are_off_and_float64_angles_are_not():
    positions = torch.tensor([100000])
    exact = torch.tensor([[formula(100000.0, c, 64) for c in range(64)]], dtype=torch.float64)
    angles32 = sinusoidal.sinusoidal_angles(positions, 64, dtype=torch.float32).double()
    table32 = torch.where(torch.arange(64) % 2 == 0, angles32.sin(), angles32.cos())
    assert (table32 - exact).abs().max() > 1e-3
    assert (posenc.sinusoidal_encoding(positions, 64).double() - exact).abs().max() < 1e-6


def test_the_four_logit_terms_add_up_to_the_logit():
    torch.manual_seed(0)
    content, code = torch.randn(2, 7, 16)
    w_q, w_k = torch.randn(2, 16, 8)
    terms = sinusoidal.input_logit_terms(content, code, w_q, w_k)
    x = (content + code).double()
    logit = (x @ w_q.double()) @ (x @ w_k.double()).T / math.sqrt(8)
    assert torch.allclose(sum(terms.values()), logit)
    with pytest.raises(ValueError, match="must have the same shape"):
        sinusoidal.input_logit_terms(content, code[:3], w_q, w_k)
