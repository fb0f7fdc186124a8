"""RoPE over several position axes: axial 2-D RoPE, M-RoPE, and their coordinates through attention and the cache."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import core
from posenc.qk.axial import axial_frequencies, axis_of_pairs, default_mrope_section, grid_positions, mrope_positions
from posenc.qk.rope_scaling import default_inv_freq
from scheme_cases import CHEAP_BACKENDS

TOL = {"atol": 2e-5, "rtol": 1e-5}


def logit(scheme, q, k, q_coords, k_coords) -> float:
    """One query against one key in float64 (attention_logits would round to float32)."""
    c = lambda v: torch.tensor(v, dtype=torch.float64)[:, None]  # noqa: E731  (axes, 1)
    return float((scheme.transform_qk(q, c(q_coords)) * scheme.transform_k(k, c(k_coords))).sum())


# --- axial 2-D RoPE ---------------------------------------------------------------------------------------------


def test_axial_frequencies_give_each_axis_the_ladder_of_half_the_head():
    rope2d = posenc.AxialRope(64)
    assert rope2d.position_axes == 2 and rope2d.sections == (16, 16)
    ladder = default_inv_freq(32, 10000.0).float()
    assert torch.equal(rope2d.inv_freq, torch.cat((ladder, ladder)))
    assert rope2d.axis_of_pair.tolist() == [0] * 16 + [1] * 16
    flux = posenc.AxialRope(128, sections=(8, 28, 28))  # FLUX's axes_dim (16, 56, 56)
    assert flux.position_axes == 3
    assert torch.equal(flux.inv_freq, torch.cat([default_inv_freq(n, 10000.0).float() for n in (16, 56, 56)]))


@settings(max_examples=40, deadline=None)
@given(
    a=st.tuples(st.integers(0, 300), st.integers(0, 300)), b=st.tuples(st.integers(0, 300), st.integers(0, 300)),
    shift=st.tuples(st.integers(-300, 300), st.integers(-300, 300)), layout=st.sampled_from(posenc.LAYOUTS), seed=st.integers(0, 1000),
)
def test_axial_scores_depend_only_on_the_row_and_column_differences(a, b, shift, layout, seed):
    q, k = torch.randn(2, 1, 1, 1, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rope2d = posenc.AxialRope(32, layout=layout)
    moved = lambda p: (p[0] + shift[0], p[1] + shift[1])  # noqa: E731
    assert abs(logit(rope2d, q, k, a, b) - logit(rope2d, q, k, moved(a), moved(b))) < 1e-9


def test_axial_rope_tells_rows_from_columns_and_a_raster_does_not():
    """Two patches one row apart and two one column apart: different logits; 1-D RoPE on raster indices confuses a row with W columns."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, 32, dtype=torch.float64)
    rope2d = posenc.AxialRope(32)
    assert abs(logit(rope2d, q, k, (1, 0), (0, 0)) - logit(rope2d, q, k, (0, 1), (0, 0))) > 1e-3
    width = 8  # on a raster 8 wide, (row 1, col 0) and (row 0, col 8) would be the same 1-D position: 2-D has no col 8, it wraps
    raster = posenc.Rope(32)
    one_row_up = float((raster.transform_qk(q, torch.tensor([width])) * raster.transform_k(k, torch.tensor([0]))).sum())
    eight_cols = float((raster.transform_qk(q, torch.tensor([width + 3])) * raster.transform_k(k, torch.tensor([3]))).sum())
    assert abs(one_row_up - eight_cols) < 1e-9


@pytest.mark.parametrize("layout", posenc.LAYOUTS)
def test_grid_width_reads_raster_positions_as_rows_and_columns(layout):
    x = torch.randn(3, 3, 12, 16)  # a batch of 3: (2, 12) can only be coordinates (test_edges: a batch of 2 is refused)
    coords = grid_positions(3, 4)
    assert coords.tolist() == [[0] * 4 + [1] * 4 + [2] * 4, [0, 1, 2, 3] * 3]
    with_width = posenc.AxialRope(16, layout=layout, grid_width=4)
    assert torch.equal(with_width.transform_qk(x, range(12)), posenc.AxialRope(16, layout=layout).transform_qk(x, coords))
    assert torch.equal(with_width.transform_qk(x, torch.arange(12)), with_width.transform_qk(x, coords))


# --- M-RoPE -----------------------------------------------------------------------------------------------------


def test_default_mrope_section_is_qwen2_vls_at_128():
    assert default_mrope_section(128) == (16, 24, 24)
    assert posenc.MRope(128).axis_of_pair.bincount().tolist() == [16, 24, 24]
    assert sum(default_mrope_section(8)) == 4


@settings(max_examples=40, deadline=None)
@given(half=st.integers(3, 64), seed=st.integers(0, 1000), start=st.integers(0, 5000), interleaved=st.booleans(), layout=st.sampled_from(posenc.LAYOUTS))
def test_mrope_with_equal_ids_is_1d_rope(half, seed, start, interleaved, layout):
    """Text tokens have t = h = w: M-RoPE must then be the language model's RoPE, bit for bit."""
    head_dim = 2 * half
    section = default_mrope_section(head_dim)
    if interleaved and (3 * section[1] - 2 > half - 1 or 3 * section[2] - 1 > half - 1):
        interleaved = False  # the interleaved layout needs room for its strides
    mrope = posenc.MRope(head_dim, mrope_section=section, mrope_interleaved=interleaved, layout=layout)
    rope = posenc.Rope(head_dim, layout=layout)
    x = torch.randn(2, 2, 5, head_dim, generator=torch.Generator().manual_seed(seed))
    p = torch.arange(start, start + 5)
    expected = rope.transform_qk(x, p)
    assert torch.equal(mrope.transform_qk(x, p.expand(3, -1)), expected)
    assert torch.equal(mrope.transform_qk(x, p), expected)  # 1-D positions are read as text
    assert torch.equal(mrope.transform_qk(x, p.expand(3, 2, -1)), expected)


@settings(max_examples=30, deadline=None)
@given(a=st.tuples(*[st.integers(0, 200)] * 3), b=st.tuples(*[st.integers(0, 200)] * 3), shift=st.tuples(*[st.integers(-200, 200)] * 3), seed=st.integers(0, 1000))
def test_mrope_scores_depend_only_on_the_differences_of_the_three_ids(a, b, shift, seed):
    q, k = torch.randn(2, 1, 1, 1, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    mrope = posenc.MRope(32, mrope_section=(4, 6, 6))
    moved = lambda p: tuple(x + s for x, s in zip(p, shift))  # noqa: E731
    assert abs(logit(mrope, q, k, a, b) - logit(mrope, q, k, moved(a), moved(b))) < 1e-9


def test_interleaved_sections_spread_the_axes_as_qwen3_vl():
    axes = axis_of_pairs((24, 20, 20), interleaved=True)
    assert axes[:9].tolist() == [0, 1, 2] * 3 and axes[-4:].tolist() == [0, 0, 0, 0] and axes.bincount().tolist() == [24, 20, 20]
    assert axis_of_pairs((2, 1, 1)).tolist() == [0, 0, 1, 2]


def test_mrope_positions_for_text_an_image_and_text():
    ids = mrope_positions([3, (1, 2, 3), 2])
    assert ids.tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
    ]  # text after the image starts at its largest id + 1 = 6, though it is the 10th token
    video = mrope_positions([(2, 2, 2), 1], start=5)
    assert video[:, 0].tolist() == [5, 5, 5] and video[:, 7].tolist() == [6, 6, 6] and video[:, 8].tolist() == [7, 7, 7]
    assert torch.equal(mrope_positions([4]), torch.arange(4).expand(3, -1))


# --- through posenc.attention and the KV cache ------------------------------------------------------------------


def mixed_sequence():
    """A text run, a 3 x 4 image, a text run: (3, 19) M-RoPE ids."""
    return mrope_positions([4, (1, 3, 4), 3])


@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
@pytest.mark.parametrize("scheme", [posenc.MRope(16), posenc.SlidingWindow(5, posenc.MRope(16))], ids=["mrope", "window"])
def test_coordinates_rotate_and_the_sequence_order_masks(scheme, backend):
    torch.manual_seed(0)
    ids = mixed_sequence()
    q, k, v = torch.randn(3, 2, 4, ids.shape[1], 16)
    got = posenc.attention(q, k, v, scheme, k_coords=ids, backend=backend)
    rotated_q, rotated_k = scheme.transform_qk(q, ids), scheme.transform_k(k, ids)
    expected = posenc.attention(rotated_q, rotated_k, v, posenc.SlidingWindow(5) if scheme.window else None)  # the mask by token order
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(posenc.attention(q, k, v, scheme, q_coords=ids, k_coords=ids, backend=backend), got, **TOL)


@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
def test_decoding_with_coordinates_through_the_cache_equals_one_full_pass(backend):
    torch.manual_seed(0)
    ids = mixed_sequence()
    length = ids.shape[1]
    for scheme, coords in ((posenc.MRope(16), ids), (posenc.AxialRope(16), ids[1:])):
        q, k, v = torch.randn(3, 2, 4, length, 16)
        full = posenc.attention(q, k, v, scheme, k_coords=coords, backend=backend)
        cache = posenc.KVCache(scheme)
        prefill = cache.step(q[:, :, :9], k[:, :, :9], v[:, :, :9], torch.arange(9), coords[:, :9], backend=backend)
        steps = [cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], [t], coords[:, t : t + 1], backend=backend) for t in range(9, length)]
        torch.testing.assert_close(torch.cat([prefill] + steps, 2), full, **TOL)


def test_per_row_coordinates_with_left_padding():
    """Two sequences, the second left-padded by 2: (batch, L) positions for the mask, (3, batch, L) ids for the rotation."""
    torch.manual_seed(0)
    mrope = posenc.MRope(16)
    ids = mrope_positions([2, (1, 2, 2), 2])
    length = ids.shape[1]
    padded = torch.cat((torch.zeros(3, 2, dtype=torch.int64), ids[:, :-2]), 1)
    coords = torch.stack((ids, padded), 1)  # (3, 2, L)
    positions = torch.stack((torch.arange(length), torch.arange(length) - 2))
    mask = torch.ones(2, 1, 1, length, dtype=torch.bool)
    mask[1, ..., :2] = False
    q, k, v = torch.randn(3, 2, 2, length, 16)
    out = posenc.attention(q, k, v, mrope, q_positions=positions, k_positions=positions, k_coords=coords, mask=mask)
    alone = posenc.attention(q[1:, :, 2:], k[1:, :, 2:], v[1:, :, 2:], mrope, k_coords=ids[:, :-2])
    torch.testing.assert_close(out[1:, :, 2:], alone, **TOL)
    torch.testing.assert_close(out[:1], posenc.attention(q[:1], k[:1], v[:1], mrope, k_coords=ids), **TOL)
    for backend in ("sdpa", "flex_uncompiled"):
        torch.testing.assert_close(posenc.attention(q, k, v, mrope, q_positions=positions, k_positions=positions, k_coords=coords, mask=mask, backend=backend), out, **TOL)


@pytest.mark.parametrize("call, words", [
    (lambda: posenc.MRope(16).transform_qk(torch.randn(1, 1, 5, 16), torch.zeros(2, 5)), "must be coordinates of shape (3, 5) or (3, batch, 5)"),
    (lambda: posenc.AxialRope(16).transform_qk(torch.randn(1, 1, 5, 16), torch.zeros(3, 5)), "one row per axis (row, col)"),
    (lambda: posenc.AxialRope(16).transform_qk(torch.randn(1, 1, 5, 16), torch.arange(5)), "or set grid_width"),
    (lambda: posenc.AxialRope(18), "head_dim must be a multiple of 4"),
    (lambda: posenc.AxialRope(16, sections=(4, 3)), "sections [4, 3] sums to 7, but a head of 16 dimensions has head_dim / 2 = 8 pairs"),
    (lambda: posenc.MRope(128, mrope_section=[16, 24, 20]), "mrope_section [16, 24, 20] sums to 60"),
    (lambda: posenc.MRope(16, mrope_section=[4, 4]), "mrope_section must have three entries"),
    (lambda: posenc.MRope(16, mrope_section=[2, 3, 3], mrope_interleaved=True), "do not fit"),
    (lambda: posenc.AxialRope(24, sections=(4, 4, 4), grid_width=3), "grid_width reads 1-D positions as (row, col)"),
    (lambda: posenc.attention(*torch.randn(3, 1, 1, 4, 16), posenc.Rope(16), k_coords=torch.zeros(3, 4)), "k_coords is for schemes with several position axes"),
    (lambda: posenc.attention(*torch.randn(3, 1, 1, 4, 16), posenc.MRope(16), k_coords=torch.zeros(2, 4)), "k_coords must have shape (3, 4) or (3, batch, 4)"),
    (lambda: posenc.attention(*torch.randn(3, 1, 1, 4, 16), posenc.MRope(16), q_coords=torch.zeros(3, 4)), "q_coords needs k_coords"),
    (lambda: posenc.attention(*torch.randn(3, 2, 1, 4, 16), posenc.MRope(16), q_positions=torch.zeros(2, 4, dtype=torch.long), k_positions=torch.zeros(2, 4, dtype=torch.long)), "need k_coords of shape (3, batch, 4)"),
    (lambda: posenc.KVCache(posenc.MRope(16)).append(*torch.randn(2, 1, 1, 4, 16), torch.arange(4), torch.zeros(3, 5)), "coords must have shape (3, 4)"),
    (lambda: mrope_positions([3, (1, 2)]), "parts[1] must be an int (text tokens) or a (t, h, w) grid"),
    (lambda: mrope_positions([]), "at least one"),
    (lambda: grid_positions(0, 4), "height must be a positive integer"),
])
def test_bad_multi_axis_input_is_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)


def test_axial_frequencies_check_their_sections():
    assert torch.equal(axial_frequencies(16, (4, 4)), torch.cat((default_inv_freq(8, 10000.0),) * 2))
    with pytest.raises(ValueError, match="sums to 9"):
        axial_frequencies(16, (4, 5))


def test_attention_logits_take_coordinates():
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 6, 16)
    coords = grid_positions(2, 3)
    scheme = posenc.AxialRope(16)
    expected = core.attention_logits(scheme.transform_qk(q, coords), scheme.transform_k(k, coords), posenc.NoPE(), None, None, 0.25)
    torch.testing.assert_close(core.attention_logits(q, k, scheme, None, None, 0.25, k_coords=coords), expected)
