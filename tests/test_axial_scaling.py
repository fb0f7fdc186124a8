"""Axial RoPE rescaled axis by axis (FiT's VisionNTK and VisionYaRN), and Pixtral's alternate rungs of one ladder
(bit for bit with transformers' PixtralVisionRotaryEmbedding, live and frozen)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hf_reference
import hf_vl_reference as ref
import posenc
from hf_reference import SOURCES
from posenc.qk import PixtralRope, grid_positions, per_axis_factors, per_axis_frequencies
from posenc.qk.axial import alternate_rung_frequencies
from posenc.qk.rope_scaling import default_inv_freq, ntk_base, yarn_mscale

SCALED = [("linear", {}), ("ntk", {}), ("yarn", {"original_max_position_embeddings": [6, 4]})]


def logit(scheme, q, k, q_coords, k_coords) -> float:
    c = lambda v: torch.tensor(v, dtype=torch.float64)[:, None]  # noqa: E731  (axes, 1)
    return float((scheme.transform_qk(q, c(q_coords)) * scheme.transform_k(k, c(k_coords))).sum())


@pytest.mark.parametrize("rope_type, params", SCALED, ids=[s[0] for s in SCALED])
@pytest.mark.parametrize("layout", posenc.LAYOUTS)
def test_factor_one_on_every_axis_is_axial_rope_exactly(rope_type, params, layout):
    x = torch.randn(3, 2, 12, 32, generator=torch.Generator().manual_seed(0))
    coords = grid_positions(3, 4) * 7  # ids past YaRN's training extents too
    scaled = posenc.AxialRope(32, layout=layout, rope_type=rope_type, factor=1.0, **params)
    assert scaled.attention_factor == 1.0
    assert torch.equal(scaled.transform_qk(x, coords), posenc.AxialRope(32, layout=layout).transform_qk(x, coords))


@pytest.mark.parametrize("rope_type, params", SCALED, ids=[s[0] for s in SCALED])
def test_each_axis_gets_the_1d_schedule_of_its_own_factor(rope_type, params):
    """The ladder of axis k is rope_scaling's schedule for head_dim 2 * sections[k] with factor[k]: nothing re-derived."""
    inv_freq, attention_factor = per_axis_frequencies(32, (8, 8), 10000.0, rope_type, factor=[4.0, 1.5], **params)
    extents = params.get("original_max_position_embeddings", [None, None])
    for k, (factor, extent) in enumerate(zip([4.0, 1.5], extents)):
        one = posenc.rope_frequencies(16, 10000.0, rope_type, factor=factor, **({} if extent is None else {"original_max_position_embeddings": extent}))
        assert torch.equal(inv_freq[8 * k : 8 * (k + 1)], one[0])
    assert attention_factor == (yarn_mscale(4.0) if rope_type == "yarn" else 1.0)  # the larger axis's temperature, once


def test_vision_ntk_divides_each_axis_slowest_frequency_by_its_own_factor():
    """FiT's VisionNTK: base_k = base * s_k^(d_k / (d_k - 2)), so each axis's slowest pair slows by exactly its factor."""
    factors = per_axis_factors((16, 16), (64, 8))  # 4 x taller, narrower than trained: rows rescaled, columns not
    assert factors == (4.0, 1.0)
    rope2d = posenc.AxialRope(32, rope_type="ntk", factor=list(factors))
    plain = default_inv_freq(16, 10000.0)
    rows, cols = rope2d.inv_freq[:8].double(), rope2d.inv_freq[8:].double()
    assert torch.equal(rope2d.inv_freq[8:], plain.float())
    assert rows[0] == 1.0 and math.isclose(float(rows[-1]), float(plain[-1]) / 4.0, rel_tol=1e-6)
    assert torch.allclose(rows, default_inv_freq(16, ntk_base(16, 10000.0, 4.0)), rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    a=st.tuples(st.integers(0, 200), st.integers(0, 200)), b=st.tuples(st.integers(0, 200), st.integers(0, 200)),
    shift=st.tuples(st.integers(-200, 200), st.integers(-200, 200)), which=st.sampled_from(range(len(SCALED))),
    factors=st.tuples(st.sampled_from([1.0, 2.0, 3.5]), st.sampled_from([1.0, 1.5, 8.0])), seed=st.integers(0, 1000),
)
def test_rescaled_axial_scores_depend_only_on_the_row_and_column_differences(a, b, shift, which, factors, seed):
    rope_type, params = SCALED[which]
    q, k = torch.randn(2, 1, 1, 1, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rope2d = posenc.AxialRope(32, rope_type=rope_type, factor=list(factors), **params)
    moved = lambda p: (p[0] + shift[0], p[1] + shift[1])  # noqa: E731
    assert abs(logit(rope2d, q, k, a, b) - logit(rope2d, q, k, moved(a), moved(b))) < 1e-9


@pytest.mark.parametrize("rope_type, params", SCALED, ids=[s[0] for s in SCALED])
def test_with_equal_ids_on_both_axes_it_is_1d_rope_with_the_two_ladders(rope_type, params):
    """At (p, p) every pair turns by p times its frequency: 1-D RoPE with the concatenated per-axis ladders."""
    x = torch.randn(3, 2, 9, 32, generator=torch.Generator().manual_seed(1))  # a batch of 3: (2, 9) can only be coordinates
    p = torch.arange(20, 29)
    rope2d = posenc.AxialRope(32, rope_type=rope_type, factor=[3.0, 1.5], **params)
    expected = posenc.apply_rope(x, p, rope2d.inv_freq, "half", attention_factor=rope2d.attention_factor)
    torch.testing.assert_close(rope2d.transform_qk(x, p.expand(2, -1)), expected, atol=1e-6, rtol=1e-6)


def test_yarn_per_axis_scales_the_logits_by_the_temperature_squared():
    q, k = torch.randn(2, 1, 1, 1, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    yarn = posenc.AxialRope(32, rope_type="yarn", factor=[4.0, 2.0], original_max_position_embeddings=[8, 8])
    unscaled = posenc.AxialRope(32, rope_type="yarn", factor=[4.0, 2.0], original_max_position_embeddings=[8, 8], attention_factor=1.0)
    assert math.isclose(logit(yarn, q, k, (5, 3), (1, 2)), yarn_mscale(4.0) ** 2 * logit(unscaled, q, k, (5, 3), (1, 2)), rel_tol=1e-6)


@pytest.mark.parametrize("call, words", [
    (lambda: posenc.AxialRope(32, rope_type="dynamic", factor=2.0), "rope_type must be one of 'default', 'linear', 'ntk', 'yarn'"),
    (lambda: posenc.AxialRope(32, rope_type="ntk", factor=[2.0, 2.0, 2.0]), "factor must be one number for every axis or a list of 2 (one per axis), got 3"),
    (lambda: posenc.AxialRope(32, rope_type="ntk", factor="2"), "factor must be a number or a list of 2 numbers (one per axis)"),
    (lambda: posenc.AxialRope(32, rope_type="ntk", factor=[0.5, 2.0]), "factor must be a finite number >= 1.0"),
    (lambda: posenc.AxialRope(32, rope_type="yarn", factor=2.0), "needs original_max_position_embeddings"),
    (lambda: posenc.AxialRope(32, rope_type="ntk", factor=2.0, beta_fast=8.0), "rope_type 'ntk' does not accept ['beta_fast']"),
    (lambda: posenc.AxialRope(32, factor=2.0), "rope_type 'default' does not accept ['factor']"),
    (lambda: per_axis_factors((16, 16), (32,)), "train_extents and test_extents must be lists of one extent per axis, of the same length"),
    (lambda: per_axis_factors((16, 0), (32, 8)), "train_extents[1] must be a positive integer"),
    (lambda: PixtralRope(18), "head_dim must be a multiple of 4"),
])
def test_bad_per_axis_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)


# --- Pixtral ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=SOURCES)
def hf(request):
    return ref.frozen() if request.param == "frozen" else ref.compute()


def test_pixtral_rope_is_transformers_pixtral_bit_for_bit(hf):
    coords, expected = (torch.tensor(v) for v in hf["pixtral_rotation"])
    x = hf_reference.rotation_input(ref.PIXTRAL_HEAD_DIM, coords.shape[1])
    assert torch.equal(PixtralRope(ref.PIXTRAL_HEAD_DIM, numerics="transformers").transform_qk(x, coords), expected.float())
    torch.testing.assert_close(PixtralRope(ref.PIXTRAL_HEAD_DIM).transform_qk(x, coords), expected.float(), atol=1e-6, rtol=0)


def test_pixtral_rows_take_the_even_rungs_and_columns_the_odd_rungs_of_one_ladder():
    ladder = default_inv_freq(32, 10000.0)
    assert torch.equal(alternate_rung_frequencies(32), torch.cat((ladder[0::2], ladder[1::2])))
    pixtral, axial = PixtralRope(32), posenc.AxialRope(32)
    assert torch.equal(pixtral.inv_freq[:8], axial.inv_freq[:8])  # rows: axial RoPE's ladder
    assert torch.allclose(pixtral.inv_freq[8:].double(), axial.inv_freq[8:].double() * 10000.0 ** (-2 / 32), rtol=1e-6)  # columns: one rung slower
    assert pixtral.axis_of_pair.tolist() == [0] * 8 + [1] * 8
