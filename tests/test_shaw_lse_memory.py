"""Shaw et al.'s value term from a fused kernel's log-sum-exp; the bytes of the index.

The value term needs only the 2k + 1 in-band weights once the log-sum-exp of every
query is known (shaw_value_term_from_lse); the int64 index the gather form needs is
built in place, so it is the only (q_len, k_len) tensor it adds.
"""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import posenc
from posenc.kernel import index_score_mod
from posenc.positions import Positions
from posenc.score.relative import (
    shaw_relative_index,
    shaw_value_term,
    shaw_value_term_from_lse,
)
from posenc.study.measure import peak_memory

try:
    from torch.nn.attention.flex_attention import AuxRequest

    LSE = {"return_aux": AuxRequest(lse=True)}
except ImportError:  # torch < 2.9
    LSE = {"return_lse": True}


def _flex(q, k, v, scheme, mask_mod):
    """FlexAttention with the scheme's key term, uncompiled: (output, lse)."""
    batch, _, q_len, _ = q.shape
    positions = Positions.resolve(None, None, q_len, k.shape[2], batch, q.device)
    score_mod = index_score_mod(scheme, positions, q)
    offset = k.shape[2] - q_len  # the queries are the last q_len key positions
    blocks = create_block_mask(
        lambda b, h, i, j: mask_mod(i + offset, j),
        None,
        None,
        q_len,
        k.shape[2],
        device="cpu",
    )
    with torch.no_grad():
        out, lse = flex_attention(
            q, k, v, score_mod=score_mod, block_mask=blocks, **LSE
        )
    return out, getattr(lse, "lse", lse)


def _inputs(q_len, k_len, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, q_len, d, generator=gen)
    k, v = torch.randn(2, 2, 3, k_len, d, generator=gen).unbind(0)
    return q, k, v


@pytest.mark.parametrize("q_len, k_len, max_distance", [(40, 40, 4), (8, 40, 6)])
def test_causal_value_term_from_the_lse_equals_the_explicit_backend(
    q_len, k_len, max_distance
):
    q, k, v = _inputs(q_len, k_len)
    shaw = posenc.ShawRelative(16, max_distance, init_std=1.0)
    keys_only = posenc.ShawRelative(16, max_distance, values=False)
    keys_only.key_table.data.copy_(shaw.key_table.data)
    out, lse = _flex(q, k, v, keys_only, lambda i, j: j <= i)
    with torch.no_grad():
        extra = shaw_value_term_from_lse(
            q, k, lse, shaw.key_table, shaw.value_table, scale=16**-0.5
        )
        expected = posenc.attention(q, k, v, shaw)
    torch.testing.assert_close(out + extra, expected)
    # the far weight given to the wrong edge row (w_k, keys ahead) is caught
    with torch.no_grad():
        wrong = shaw_value_term_from_lse(
            q,
            k,
            lse,
            shaw.key_table,
            shaw.value_table,
            16**-0.5,
            False,
            torch.zeros_like(lse),
        )
    assert (out + wrong - expected).abs().max() > 1e-2


def test_bidirectional_value_term_needs_the_far_left_weight():
    L, max_distance = 40, 5
    q, k, v = _inputs(L, L, seed=1)
    shaw = posenc.ShawRelative(16, max_distance, init_std=1.0)
    keys_only = posenc.ShawRelative(16, max_distance, values=False)
    keys_only.key_table.data.copy_(shaw.key_table.data)
    out, lse = _flex(q, k, v, keys_only, lambda i, j: j >= 0)
    _, lse_left = _flex(q, k, v, keys_only, lambda i, j: j - i < -max_distance)
    far_left = torch.exp(lse_left - lse)  # 0 where no key lies that far back
    tables = (shaw.key_table, shaw.value_table)
    with torch.no_grad():
        extra = shaw_value_term_from_lse(
            q, k, lse, *tables, scale=16**-0.5, causal=False, far_left=far_left
        )
        expected = posenc.attention(q, k, v, shaw, causal=False)
        torch.testing.assert_close(out + extra, expected)
        # giving all the far weight to one edge row is a different value term
        wrong = shaw_value_term_from_lse(q, k, lse, *tables, scale=16**-0.5)
        assert (out + wrong - expected).abs().max() > 1e-2
        with pytest.raises(ValueError, match="far_left"):
            shaw_value_term_from_lse(q, k, lse, *tables, 0.25, causal=False)


def test_value_term_from_the_lse_grows_linearly_in_the_length():
    d, max_distance = 64, 16
    tables = torch.randn(2, 2 * max_distance + 1, d).unbind(0)
    held = {}
    for L in (512, 1024):
        q, k, _ = _inputs(L, L, d=d)
        lse = torch.randn(2, 3, L)
        held[L] = peak_memory(shaw_value_term_from_lse, q, k, lse, *tables, d**-0.5)
    assert held[1024] <= 2 * held[512] + 4096  # nothing of size (L, L)
    assert held[1024] < 2 * 3 * 1024 * 1024 * 4 / 4  # a quarter of the scores


def test_the_index_is_the_only_l_by_l_tensor_it_builds():
    L, max_distance = 512, 16
    # int64, and the two position vectors it is made from (held 4x the scores before
    # it was clipped and shifted in place)
    assert peak_memory(shaw_relative_index, L, L, max_distance) == (L * L + 2 * L) * 8


def test_shaw_value_term_of_the_scheme_adds_one_index_to_its_slots_and_output():
    L, d, max_distance = 512, 64, 16
    shaw = posenc.ShawRelative(d, max_distance)
    weights = torch.rand(1, 1, L, L)
    positions = Positions.resolve(None, None, L, L, 1, weights.device)
    with torch.no_grad():
        held = peak_memory(shaw.value_term, weights, positions)
        index = shaw_relative_index(L, L, max_distance)
        torch.testing.assert_close(
            shaw.value_term(weights, positions),
            shaw_value_term(weights, shaw.value_table, index),
        )
    slots_and_output = L * (2 * max_distance + 1 + d) * 4
    assert held <= L * L * 8 + slots_and_output
