import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import core
from scheme_cases import CHEAP_BACKENDS, SCHEME_ARGS, every_scheme, scheme_id

SCHEMES = every_scheme()
TOL = {"atol": 2e-5, "rtol": 1e-5}


def qkv(batch=2, heads=4, q_len=10, k_len=10, head_dim=16):
    return torch.randn(batch, heads, q_len, head_dim), torch.randn(batch, heads, k_len, head_dim), torch.randn(batch, heads, k_len, head_dim)


def test_every_registered_scheme_is_covered():
    assert set(SCHEME_ARGS) == set(posenc.SCHEMES)


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", ["sdpa", "flex_uncompiled"])
def test_backends_agree(scheme, causal, backend):
    q, k, v = qkv()
    if scheme.needs_weights:
        with pytest.raises(ValueError, match="only backend='explicit'"):
            posenc.attention(q, k, v, scheme, causal=causal, backend=backend)
        return
    expected = posenc.attention(q, k, v, scheme, causal=causal)
    torch.testing.assert_close(posenc.attention(q, k, v, scheme, causal=causal, backend=backend), expected, **TOL)


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
def test_backends_agree_with_a_padding_mask_and_offset_positions(scheme, backend):
    if scheme.needs_weights and backend != "explicit":
        pytest.skip("the value term runs on the explicit backend only (test_backends_agree checks the error)")
    q, k, v = qkv(q_len=3, k_len=12)
    padding = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    padding[1, ..., :5] = False  # the second sequence is left-padded
    q_pos, k_pos = torch.arange(109, 112), torch.arange(100, 112)
    expected = posenc.attention(q, k, v, scheme, mask=padding, q_positions=q_pos, k_positions=k_pos)
    got = posenc.attention(q, k, v, scheme, mask=padding, q_positions=q_pos, k_positions=k_pos, backend=backend)
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
def test_decoding_with_a_cache_equals_one_full_pass(scheme, backend):
    """One token at a time against a growing cache of (already transformed) keys and values."""
    if scheme.needs_weights and backend != "explicit":
        pytest.skip("the value term runs on the explicit backend only (test_backends_agree checks the error)")
    q, k, v = qkv(q_len=9, k_len=9)
    full = posenc.attention(q, k, v, scheme, backend=backend)
    keys, values, steps = [], [], []
    for t in range(9):
        keys.append(scheme.transform_k(k[:, :, t : t + 1], torch.tensor([t])))  # a cache stores rotated keys
        values.append(v[:, :, t : t + 1])
        steps.append(
            posenc.attention(
                q[:, :, t : t + 1], torch.cat(keys, 2), torch.cat(values, 2), scheme,
                q_positions=torch.tensor([t]), k_positions=torch.arange(t + 1), keys_transformed=True, backend=backend,
            )
        )
    torch.testing.assert_close(torch.cat(steps, 2), full, **TOL)


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
def test_fully_masked_rows_give_zeros_not_nan(scheme, backend):
    if scheme.needs_weights and backend != "explicit":
        pytest.skip("the value term runs on the explicit backend only (test_backends_agree checks the error)")
    q, k, v = qkv(batch=1, q_len=6, k_len=6)
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    mask[..., :2, :] = False  # the first two queries may attend to nothing (padding)
    out = posenc.attention(q, k, v, scheme, mask=mask, backend=backend)
    assert not out.isnan().any()
    assert torch.equal(out[..., :2, :], torch.zeros_like(out[..., :2, :]))
    torch.testing.assert_close(out[..., 2:, :], posenc.attention(q, k, v, scheme, mask=mask)[..., 2:, :], **TOL)


def test_weights_are_a_causal_distribution():
    q, k, v = qkv()
    out, weights = posenc.attention(q, k, v, posenc.ALiBi(4), return_weights=True)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 10))
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))
    torch.testing.assert_close(out, weights @ v)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), length=st.integers(2, 12))
def test_without_positions_attention_is_permutation_equivariant(seed, length):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, 2, length, 8, generator=gen)
    perm = torch.randperm(length, generator=gen)
    out = posenc.attention(q, k, v, causal=False)
    permuted = posenc.attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], causal=False)
    torch.testing.assert_close(permuted, out[:, :, perm])


def test_input_hook_schemes_leave_attention_unchanged():
    q, k, v = qkv()
    torch.testing.assert_close(posenc.attention(q, k, v, posenc.Sinusoidal(16)), posenc.attention(q, k, v))


def test_rope_logits_are_relative_under_attention():
    q, k, v = qkv(batch=1, heads=1, q_len=1, k_len=1)
    scheme = posenc.Rope(16)
    a = core.attention_logits(q, k, scheme, torch.tensor([5]), torch.tensor([2]), 1.0)
    b = core.attention_logits(q, k, scheme, torch.tensor([1005]), torch.tensor([1002]), 1.0)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_default_scale_is_one_over_sqrt_head_dim():
    q, k, v = qkv(batch=1, heads=1, q_len=3, k_len=3)
    _, weights = posenc.attention(q, k, v, causal=False, return_weights=True)
    expected = (q @ k.transpose(-1, -2) / math.sqrt(16)).softmax(-1)
    torch.testing.assert_close(weights, expected)


def test_sdpa_keeps_the_dtype():
    q, k, v = (t.to(torch.bfloat16) for t in qkv())
    out = posenc.attention(q, k, v, posenc.ALiBi(4), backend="sdpa")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), posenc.attention(q, k, v, posenc.ALiBi(4)).float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_casting_a_scheme_keeps_its_constants_in_float32(dtype):
    """model.to(bf16) must not round RoPE frequencies or ALiBi slopes (angles at large positions would drift)."""
    rope, alibi = posenc.Rope(128), posenc.ALiBi(12)
    exact_freq, exact_slopes = rope.inv_freq.clone(), alibi.slopes.clone()
    rope.to(dtype), alibi.to(dtype)
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, exact_freq)
    assert alibi.slopes.dtype == torch.float32 and torch.equal(alibi.slopes, exact_slopes)
    x = torch.randn(1, 1, 4, 128).to(dtype)
    positions = torch.arange(16000, 16004)
    torch.testing.assert_close(rope.transform_qk(x, positions), posenc.apply_rope(x, positions, exact_freq))
