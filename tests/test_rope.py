import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.qk import rope_forms
from posenc.qk import rotation

DIMS = [2, 8, 64, 128]


@pytest.mark.parametrize("head_dim", DIMS)
@pytest.mark.parametrize("base", [10000.0, 500000.0, 1e6])
def test_inv_freq_is_base_to_minus_2i_over_d(head_dim, base):
    inv_freq, factor = posenc.rope_frequencies(head_dim, base)
    expected = torch.tensor([base ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64)
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (head_dim // 2,)
    assert torch.allclose(inv_freq.double(), expected, rtol=1e-7, atol=0)
    assert factor == 1.0


@pytest.mark.parametrize("layout", posenc.LAYOUTS)
def test_position_zero_is_the_identity(layout):
    x = torch.randn(2, 3, 4, 16)
    inv_freq, _ = posenc.rope_frequencies(16)
    assert torch.equal(posenc.apply_rope(x, torch.zeros(4, dtype=torch.long), inv_freq, layout), x)


@pytest.mark.parametrize("layout", posenc.LAYOUTS)
def test_matrix_form_agrees(layout):
    torch.manual_seed(0)
    x = torch.randn(5, 32)
    inv_freq, _ = posenc.rope_frequencies(32)
    positions = torch.tensor([0, 1, 7, 300, 4095])
    rotated = posenc.apply_rope(x, positions, inv_freq, layout)
    by_matrix = torch.stack([rope_forms.rope_rotation_matrix(p, inv_freq, layout) @ x[i].double() for i, p in enumerate(positions.tolist())])
    # float32 angles at position 4095 are off by up to ~4095 * 2^-24 rad
    assert torch.allclose(rotated.double(), by_matrix, atol=1e-3)


def test_complex_form_agrees_with_interleaved():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 64)
    inv_freq, _ = posenc.rope_frequencies(64)
    positions = torch.arange(100, 109)
    assert torch.allclose(rope_forms.apply_rope_complex(x, positions, inv_freq), posenc.apply_rope(x, positions, inv_freq, "interleaved"), atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 20000), n=st.integers(0, 20000), shift=st.integers(0, 20000), layout=st.sampled_from(posenc.LAYOUTS), seed=st.integers(0, 1000))
def test_scores_depend_only_on_m_minus_n(m, n, shift, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 64, generator=gen, dtype=torch.float64)
    inv_freq, _ = posenc.rope_frequencies(64)
    inv_freq = inv_freq.double()

    def score(a, b):
        return (posenc.apply_rope(q, [a], inv_freq, layout) @ posenc.apply_rope(k, [b], inv_freq, layout).T).item()

    # angles are formed in float32, so large positions carry ~1e-3 rad of rounding: compare at that scale
    assert math.isclose(score(m, n), score(m + shift, n + shift), abs_tol=2e-2 * 64)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(0, 100000), layout=st.sampled_from(posenc.LAYOUTS), seed=st.integers(0, 1000))
def test_norms_are_preserved(p, layout, seed):
    x = torch.randn(3, 1, 64, generator=torch.Generator().manual_seed(seed))
    inv_freq, _ = posenc.rope_frequencies(64)
    y = posenc.apply_rope(x, [p], inv_freq, layout)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(-3000, 3000), n=st.integers(-3000, 3000))
def test_rotations_compose(m, n):
    inv_freq, _ = posenc.rope_frequencies(16)
    for layout in posenc.LAYOUTS:
        r = rope_forms.rope_rotation_matrix
        assert torch.allclose(r(m, inv_freq, layout).T @ r(n, inv_freq, layout), r(n - m, inv_freq, layout), atol=1e-9)


def test_the_row_permutation_maps_interleaved_to_half():
    torch.manual_seed(0)
    head_dim, seq = 32, 11
    perm = rope_forms.interleaved_to_half_permutation(head_dim)
    inv_freq, _ = posenc.rope_frequencies(head_dim)
    x = torch.randn(2, 3, seq, head_dim)
    positions = torch.arange(seq)
    assert torch.equal(posenc.apply_rope(x[..., perm], positions, inv_freq, "half"), posenc.apply_rope(x, positions, inv_freq, "interleaved")[..., perm])
    # and therefore the logits agree when W_q and W_k rows are permuted; without it they do not
    wq, wk, h = torch.randn(head_dim, 48), torch.randn(head_dim, 48), torch.randn(seq, 48)
    q_i, k_i = posenc.apply_rope(h @ wq.T, positions, inv_freq, "interleaved"), posenc.apply_rope(h @ wk.T, positions, inv_freq, "interleaved")
    q_h, k_h = posenc.apply_rope(h @ wq[perm].T, positions, inv_freq, "half"), posenc.apply_rope(h @ wk[perm].T, positions, inv_freq, "half")
    q_wrong, k_wrong = posenc.apply_rope(h @ wq.T, positions, inv_freq, "half"), posenc.apply_rope(h @ wk.T, positions, inv_freq, "half")
    assert torch.allclose(q_i @ k_i.T, q_h @ k_h.T, atol=1e-3)
    assert not torch.allclose(q_i @ k_i.T, q_wrong @ k_wrong.T, atol=1.0)


@pytest.mark.parametrize("rotated_part", ["first", "last"])
def test_the_row_permutation_of_a_partial_rotation_stays_inside_the_rotated_part(
    rotated_part,
):
    # GPT-J rotates 64 of 256 dimensions, interleaved: the permutation to rotate-half
    # must pair within those 64 and leave the pass-through dimensions in place
    head_dim, factor, seq = 32, 0.25, 7
    perm = rope_forms.interleaved_to_half_permutation(head_dim, factor, rotated_part)
    assert sorted(perm.tolist()) == list(range(head_dim))
    inv_freq, _ = posenc.rope_frequencies(head_dim, partial_rotary_factor=factor)
    x = torch.randn(2, 3, seq, head_dim, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(100, 100 + seq)

    def rope(y, layout):
        return posenc.apply_rope(
            y, positions, inv_freq, layout, partial_rotary_factor=factor,
            rotated_part=rotated_part,
        )

    assert torch.equal(rope(x[..., perm], "half"), rope(x, "interleaved")[..., perm])
    kept = perm[8:] if rotated_part == "first" else perm[:-8]
    assert torch.equal(kept, torch.arange(8, 32) if rotated_part == "first" else torch.arange(24))
    # the whole head's permutation mixes pass-through dimensions into the pairs
    whole = rope_forms.interleaved_to_half_permutation(head_dim)
    assert not torch.allclose(
        rope(x[..., whole], "half"), rope(x, "interleaved")[..., whole], atol=0.1
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_output_keeps_the_dtype_and_angles_are_float32(dtype):
    """In half precision the angles, cos and sin are float32, rounded once to the dtype; the rotation runs in the dtype (as Hugging Face)."""
    inv_freq, _ = posenc.rope_frequencies(64)
    x = torch.randn(1, 1, 4, 64).to(dtype)
    positions = torch.tensor([0, 1000, 20001, 65535])
    y = posenc.apply_rope(x, positions, inv_freq)
    assert y.dtype == dtype
    cos, sin = rotation.rope_cos_sin(positions, inv_freq, x.float())
    expected = rotation.rotate_pairs(x, cos.to(dtype), sin.to(dtype))
    assert torch.equal(y, expected)
    reference = posenc.apply_rope(x.float(), positions, inv_freq)  # all in float32: within a few units of the dtype's rounding
    assert float((y.float() - reference).abs().max()) <= 4 * torch.finfo(dtype).eps * float(x.float().abs().max())


def test_float64_inputs_get_float64_angles():
    inv_freq, _ = posenc.rope_frequencies(64)
    x = torch.randn(1, 1, 2, 64, dtype=torch.float64)
    by64 = rope_forms.apply_rope_angles(x, rotation.rope_angles([65535, 3], inv_freq, torch.float64))
    assert torch.equal(posenc.apply_rope(x, torch.tensor([65535, 3]), inv_freq), by64)


def test_bf16_angles_drift_and_fp32_angles_do_not():
    inv_freq, _ = posenc.rope_frequencies(128)
    positions = torch.arange(30000, 30100)
    exact = rotation.rope_angles(positions, inv_freq, torch.float64)
    err32 = (rotation.rope_angles(positions, inv_freq, torch.float32).double() - exact).abs().max()
    err16 = (rotation.rope_angles(positions, inv_freq, torch.bfloat16).double() - exact).abs().max()
    assert err32 < 1e-2
    assert err16 > 10.0  # bf16 keeps 8 significant bits: position 30001 rounds by up to 64


def test_attention_factor_scales_cos_and_sin():
    inv_freq, _ = posenc.rope_frequencies(8)
    x = torch.randn(3, 8)
    assert torch.allclose(posenc.apply_rope(x, torch.arange(3), inv_freq, attention_factor=2.0), 2 * posenc.apply_rope(x, torch.arange(3), inv_freq))


def test_positions_broadcast_per_batch():
    inv_freq, _ = posenc.rope_frequencies(8)
    x = torch.randn(2, 4, 8)
    positions = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]])
    y = posenc.apply_rope(x, positions, inv_freq)
    assert torch.allclose(y[1], posenc.apply_rope(x[1], torch.arange(10, 14), inv_freq))


def test_scheme_uses_its_layout_and_factor():
    s = posenc.Rope(16, layout="interleaved")
    x = torch.randn(1, 2, 5, 16)
    assert s.hook == "qk"
    assert torch.equal(s.transform_qk(x, torch.arange(5)), posenc.apply_rope(x, torch.arange(5), s.inv_freq, "interleaved"))


@pytest.mark.parametrize("layout", posenc.LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_apply_rope_is_apply_rope_angles_of_rope_angles(layout, dtype):
    x = torch.randn(2, 3, 6, 16).to(dtype)
    inv_freq, _ = posenc.rope_frequencies(16)
    positions = torch.tensor([0, 3, 99, 1000, 4096, 50000])
    angle_dtype = torch.promote_types(dtype, torch.float32)
    assert torch.equal(posenc.apply_rope(x, positions, inv_freq, layout), rope_forms.apply_rope_angles(x, rotation.rope_angles(positions, inv_freq, angle_dtype), layout))


def test_apply_rope_angles_in_float64_is_more_exact():
    inv_freq, _ = posenc.rope_frequencies(64)
    x = torch.randn(1, 1, 64, dtype=torch.float64)
    exact = rope_forms.apply_rope_complex(x[..., :], [70000], inv_freq)
    by64 = rope_forms.apply_rope_angles(x, rotation.rope_angles([70000], inv_freq, torch.float64), "interleaved")
    by32 = rope_forms.apply_rope_angles(x, rotation.rope_angles([70000], inv_freq, torch.float32), "interleaved")
    assert (by64 - exact).abs().max() < 1e-12 < (by32 - exact).abs().max()


def test_decay_bound_starts_at_one_and_falls_on_average():
    inv_freq, _ = posenc.rope_frequencies(128)
    bound = rope_forms.rope_decay_bound(torch.arange(0, 4096), inv_freq)
    assert bound[0].item() == pytest.approx((128 / 2 + 1) / 2)  # |S_j| = j at distance 0, averaged over j = 1..d/2
    assert bound[1024:].mean() < bound[:16].mean() / 4


def test_decay_bound_bounds_the_logit():
    """|logit| <= max_j |h_{j+1} - h_j| * sum_j |S_j| (Abel summation), for random q and k."""
    torch.manual_seed(1)
    head_dim = 32
    inv_freq, _ = posenc.rope_frequencies(head_dim)
    q, k = torch.randn(2, 1, head_dim, dtype=torch.float64)
    h = torch.view_as_complex(q.unflatten(-1, (-1, 2))) * torch.view_as_complex(k.unflatten(-1, (-1, 2))).conj()
    h = torch.cat((h[0], torch.zeros(1, dtype=h.dtype)))  # h_{d/2 + 1} = 0
    step = (h[1:] - h[:-1]).abs().max()
    for r in [0, 1, 5, 40, 300, 2000]:
        logit = rope_forms.apply_rope_complex(q, [r], inv_freq) @ k.T
        assert abs(logit.item()) <= step * rope_forms.rope_decay_bound([r], inv_freq).item() * (head_dim / 2) + 1e-9


def test_decoding_builds_a_table_only_when_the_length_doubles():
    """A query at n - 1 after keys 0..n-1 slices a table grown in powers of two: O(1) rows a token, bit-identical slices."""
    import unittest.mock

    import posenc.qk.rope as rope_module

    rows, real = [], rope_module.rope_cos_sin

    def counting(positions, *args, **kwargs):
        rows.append(torch.as_tensor(positions).numel())
        return real(positions, *args, **kwargs)

    rope, n = posenc.Rope(16), 100
    q, k, v = torch.randn(3, 1, 2, n, 16).unbind(0)
    with unittest.mock.patch.object(rope_module, "rope_cos_sin", counting):
        cache, outs = posenc.KVCache(rope), []
        for t in range(n):
            outs.append(cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], [t]))
    assert sum(rows) == n + (1 + 2 + 4 + 8 + 16 + 32 + 64 + 128)  # the keys, one row each; the query's tables by doubling
    torch.testing.assert_close(torch.cat(outs, dim=2), posenc.attention(q, k, v, rope))
    for start, stop in ((0, 5), (3, 7), (6, 7), (0, 0)):
        like = q[:, :, : stop - start]
        sliced = rope.cos_sin(range(start, stop), like)
        direct = rope.cos_sin(torch.arange(start, stop), like)
        assert all(torch.equal(a, b) for a, b in zip(sliced, direct))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotate_pairs_compiles_to_one_graph_without_gradients(layout):
    # under torch.compile the rotation runs out of place: the out= writes into views of one buffer, which eager code
    # uses to save memory, break dynamo's graph ("non-contiguous out= tensor") and ran 9x slower than a copy on a CPU
    x = torch.randn(1, 2, 16, 8)
    cos, sin = (f(torch.randn(16, 4)) for f in (torch.cos, torch.sin))
    with torch.no_grad():
        explained = torch._dynamo.explain(lambda x, c, s: rotation.rotate_pairs(x, c, s, layout))(x, cos, sin)
        eager = rotation.rotate_pairs(x, cos, sin, layout)
        compiled = torch.compile(lambda x, c, s: rotation.rotate_pairs(x, c, s, layout), backend="aot_eager")(x, cos, sin)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch.testing.assert_close(compiled, eager)
