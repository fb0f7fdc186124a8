"""Attention sinks next to the sliding window, and the window as a FlexAttention mask_mod."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.masks import window_mask_mod, window_mask_with_sinks


@settings(max_examples=40, deadline=None)
@given(q_len=st.integers(1, 16), extra=st.integers(0, 16), window=st.integers(1, 20), num_sinks=st.integers(0, 6))
def test_sinks_mask_is_the_window_plus_the_first_positions(q_len, extra, window, num_sinks):
    k_len = q_len + extra
    q_pos, k_pos = posenc.default_positions(q_len, k_len)
    mask = window_mask_with_sinks(q_pos, k_pos, window, num_sinks)
    for r, i in enumerate(q_pos.tolist()):
        assert mask[r].tolist() == [j <= i and (i - window < j or j < num_sinks) for j in range(k_len)]
    assert bool((mask.sum(-1) <= window + num_sinks).all())


def test_no_sinks_is_the_plain_window_and_sinks_never_see_the_future():
    pos = torch.arange(30)
    assert torch.equal(window_mask_with_sinks(pos, pos, 5, 0), posenc.window_mask(pos, pos, 5))
    mask = window_mask_with_sinks(pos, pos, 5, 4)
    assert not (mask & ~posenc.causal_mask(pos, pos)).any()  # still causal
    assert mask[4:, :4].all()  # every later query sees the four sinks


def test_sinks_are_positions_not_indices():
    """Decoding against a cache that starts at position 100: no key there is a sink."""
    q_pos, k_pos = torch.tensor([110]), torch.arange(100, 111)
    assert torch.equal(window_mask_with_sinks(q_pos, k_pos, 3, 4), posenc.window_mask(q_pos, k_pos, 3))


@pytest.mark.parametrize("q_len, k_len, window, num_sinks", [(12, 12, 4, 0), (1, 20, 5, 0), (7, 19, 3, 2), (9, 9, 1, 3)])
def test_mask_mod_equals_the_boolean_masks(q_len, k_len, window, num_sinks):
    q_pos, k_pos = posenc.default_positions(q_len, k_len)
    mod = window_mask_mod(window, num_sinks, q_offset=k_len - q_len)
    grid = mod(0, 0, torch.arange(q_len)[:, None], torch.arange(k_len)[None, :])
    assert torch.equal(grid, window_mask_with_sinks(q_pos, k_pos, window, num_sinks))
    if num_sinks == 0:
        assert torch.equal(grid, posenc.sliding_window_mask(q_len, k_len, window))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_block_mask_from_mask_mod_gives_the_windowed_attention():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    length, window = 256, 32
    q, k, v = torch.randn(3, 1, 2, length, 16)
    block_mask = create_block_mask(window_mask_mod(window), None, None, length, length, device="cpu")
    # 128-token blocks: query block 0 needs key block 0; query block 1 needs key blocks 0 (its first 31 rows) and 1
    assert block_mask.kv_num_blocks.flatten().tolist() == [1, 2]
    out = flex_attention(q, k, v, block_mask=block_mask)
    torch.testing.assert_close(out, posenc.attention(q, k, v, posenc.SlidingWindow(window)), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", posenc.BACKENDS)
def test_sinks_mask_through_attention_keeps_every_backend_in_agreement(backend):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 20, 8)
    pos = torch.arange(20)
    mask = window_mask_with_sinks(pos, pos, 4, 2)
    ref = posenc.attention(q, k, v, posenc.Rope(8), mask=mask, backend="explicit")
    torch.testing.assert_close(posenc.attention(q, k, v, posenc.Rope(8), mask=mask, backend=backend), ref, atol=2e-5, rtol=1e-5)
    _, w = posenc.attention(q, k, v, posenc.NoPE(), mask=mask, return_weights=True)
    assert bool((w[..., 10, :2] > 0).all()) and bool((w[..., 10, 2:7] == 0).all())  # sinks on, the gap off


@pytest.mark.parametrize("call, words", [
    (lambda: window_mask_with_sinks([3], [0, 1, 2, 3], 2, -1), "num_sinks must be a non-negative integer"),
    (lambda: window_mask_with_sinks([3], [0, 1, 2, 3], 2, 1.5), "num_sinks must be a non-negative integer"),
    (lambda: window_mask_with_sinks([3], [0, 1, 2, 3], 0, 1), "window must be a positive integer"),
    (lambda: window_mask_with_sinks([3.0], [0, 1], 2, 1), "q_positions must be integers"),
    (lambda: window_mask_mod(0), "window must be a positive integer"),
    (lambda: window_mask_mod(4, num_sinks=True), "num_sinks must be a non-negative integer"),
    (lambda: window_mask_mod(4, q_offset=-1), "q_offset must be a non-negative integer"),
])
def test_bad_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)
