"""Masks as mask_mods over positions: the window, attention sinks, combinators, and their block masks."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.positions import default_positions
from posenc.score.masks import and_masks, causal, mask_matrix, or_masks, sliding_window

CHEAP_BACKENDS = ("explicit", "sdpa", "flex_uncompiled")


@settings(max_examples=40, deadline=None)
@given(q_len=st.integers(1, 16), extra=st.integers(0, 16), window=st.integers(1, 20), num_sinks=st.integers(0, 6))
def test_sinks_mask_is_the_window_plus_the_first_positions(q_len, extra, window, num_sinks):
    num_sinks = min(num_sinks, window)
    k_len = q_len + extra
    q_pos, k_pos = default_positions(q_len, k_len)
    mask = mask_matrix(sliding_window(window, num_sinks), q_pos, k_pos)
    for r, i in enumerate(q_pos.tolist()):
        assert mask[r].tolist() == [j <= i and (i - window < j or j < num_sinks) for j in range(k_len)]
    assert bool((mask.sum(-1) <= window + num_sinks).all())


def test_sinks_never_see_the_future_and_combinators_are_and_or():
    pos = torch.arange(30)
    mask = mask_matrix(sliding_window(5, 4), pos, pos)
    assert not (mask & ~mask_matrix(causal, pos, pos)).any()  # still causal
    assert mask[4:, :4].all()  # every later query sees the four sinks
    window = mask_matrix(sliding_window(5), pos, pos)
    sinks = mask_matrix(lambda b, h, q, k: k < 4, pos, pos)
    assert torch.equal(mask, mask_matrix(and_masks(causal, or_masks(sliding_window(5), lambda b, h, q, k: k < 4)), pos, pos))
    assert torch.equal(mask, (window | sinks) & mask_matrix(causal, pos, pos))


def test_sinks_are_positions_not_indices():
    """Decoding against a cache that starts at position 100: no key there is a sink."""
    q_pos, k_pos = torch.tensor([110]), torch.arange(100, 111)
    assert torch.equal(mask_matrix(sliding_window(3, 2), q_pos, k_pos), mask_matrix(sliding_window(3), q_pos, k_pos))


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_the_cached_block_mask_skips_blocks_outside_the_window():
    from posenc.kernel import block_mask
    from posenc.positions import Positions

    torch.manual_seed(0)
    length, window = 256, 32
    q, k, v = torch.randn(3, 1, 2, length, 16)
    scheme = posenc.SlidingWindow(window)
    blocks = block_mask(scheme, Positions(length, length), True, q, k, None)
    # 128-token blocks: query block 0 needs key block 0; query block 1 needs key blocks 0 (its first 31 rows) and 1
    assert blocks.kv_num_blocks.flatten().tolist() == [1, 2]
    assert block_mask(scheme, Positions(length, length), True, q, k, None) is blocks  # built once per shape
    with torch.no_grad():
        out = posenc.attention(q, k, v, scheme, backend="flex_uncompiled")
    torch.testing.assert_close(out, posenc.attention(q, k, v, scheme), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
def test_sinks_through_attention_keep_every_backend_in_agreement(backend):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 20, 8)
    scheme = posenc.SlidingWindow(4, posenc.Rope(8), num_sinks=2)
    pos = torch.arange(20)
    by_mask = posenc.attention(q, k, v, posenc.Rope(8), mask=mask_matrix(sliding_window(4, 2), pos, pos))
    torch.testing.assert_close(posenc.attention(q, k, v, scheme, backend=backend), by_mask, atol=2e-5, rtol=1e-5)
    _, w = posenc.attention(q, k, v, posenc.SlidingWindow(4, num_sinks=2), return_weights=True)
    assert bool((w[..., 10, :2] > 0).all()) and bool((w[..., 10, 2:7] == 0).all())  # sinks on, the gap off


@pytest.mark.parametrize("call, words", [
    (lambda: sliding_window(2, -1), "num_sinks must be a non-negative integer"),
    (lambda: sliding_window(2, 1.5), "num_sinks must be a non-negative integer"),
    (lambda: sliding_window(0, 1), "window must be a positive integer"),
    (lambda: sliding_window(4, num_sinks=True), "num_sinks must be a non-negative integer"),
    (lambda: sliding_window(4, num_sinks=5), "num_sinks must not exceed the window"),
    (lambda: posenc.SlidingWindow(4, num_sinks=5), "num_sinks must not exceed the window"),
    (lambda: mask_matrix(causal, [3.0], [0, 1]), "q_positions must be integers"),
    (lambda: mask_matrix(causal, torch.zeros(2, 2, dtype=torch.long), torch.arange(2)), "must be one-dimensional"),
    (lambda: and_masks(), "and_masks needs at least one mask_mod"),
])
def test_bad_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)
