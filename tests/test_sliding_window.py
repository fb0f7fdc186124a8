import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from scheme_cases import CHEAP_BACKENDS
from posenc.positions import default_positions
from posenc.score.masks import mask_matrix, sliding_window

HAVE_HF = importlib.util.find_spec("transformers") is not None


@settings(max_examples=40, deadline=None)
@given(q_len=st.integers(1, 20), extra=st.integers(0, 20), window=st.integers(1, 30))
def test_mask_is_i_minus_w_below_j_at_most_i(q_len, extra, window):
    k_len = q_len + extra
    mask = mask_matrix(sliding_window(window), *default_positions(q_len, k_len))
    for r in range(q_len):
        i = k_len - q_len + r  # queries are the last q_len positions
        assert mask[r].tolist() == [i - window < j <= i for j in range(k_len)]
    assert bool((mask.sum(-1) <= window).all())  # a window of W keys includes the query itself


@pytest.mark.skipif(not HAVE_HF, reason="transformers not installed")
@pytest.mark.parametrize("q_len, k_len, window", [(10, 10, 3), (1, 17, 4), (5, 12, 1), (8, 8, 100)])
def test_mask_equals_hugging_faces_sliding_window_causal_mask(q_len, k_len, window):
    from transformers.masking_utils import sliding_window_causal_mask_function

    fn = sliding_window_causal_mask_function(window)
    expected = torch.tensor([[bool(fn(0, 0, torch.tensor(q), torch.tensor(kv))) for kv in range(k_len)] for q in range(k_len - q_len, k_len)])
    assert torch.equal(mask_matrix(sliding_window(window), *default_positions(q_len, k_len)), expected)


@pytest.mark.parametrize("inner", [None, posenc.Rope(16), posenc.ALiBi(2)], ids=["nope", "rope", "alibi"])
@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
def test_a_rolling_cache_of_w_entries_equals_one_full_masked_pass(inner, backend):
    torch.manual_seed(0)
    window, length = 4, 15
    scheme = posenc.SlidingWindow(window, inner)
    q, k, v = torch.randn(3, 2, 2, length, 16)
    full = posenc.attention(q, k, v, scheme, backend=backend)
    cache = posenc.KVCache(scheme)
    steps = []
    for t in range(length):
        cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1], [t])
        assert len(cache) == min(t + 1, window)  # memory stays O(W)
        steps.append(cache.attend(q[:, :, t : t + 1], [t], backend=backend))
    torch.testing.assert_close(torch.cat(steps, 2), full, atol=2e-5, rtol=1e-5)


def test_a_window_of_one_sees_only_itself():
    q, k, v = torch.randn(3, 1, 1, 6, 8)
    torch.testing.assert_close(posenc.attention(q, k, v, posenc.SlidingWindow(1)), v)


def test_a_window_as_long_as_the_sequence_is_plain_causal_attention():
    q, k, v = torch.randn(3, 1, 2, 9, 8)
    torch.testing.assert_close(posenc.attention(q, k, v, posenc.SlidingWindow(9, posenc.ALiBi(2))), posenc.attention(q, k, v, posenc.ALiBi(2)))


def test_padding_plus_window_leaves_no_nan():
    q, k, v = torch.randn(3, 1, 1, 8, 8)
    padding = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    padding[..., 4:] = False  # right padding: queries 6, 7 see only padded keys inside their window of 2
    for backend in CHEAP_BACKENDS:
        out = posenc.attention(q, k, v, posenc.SlidingWindow(2), mask=padding, backend=backend)
        assert not out.isnan().any() and torch.equal(out[..., 6:, :], torch.zeros_like(out[..., 6:, :]))


def test_receptive_field_grows_by_w_minus_one_per_layer():
    """Stacking layers of windowed attention: after n layers a token depends on the n (W - 1) tokens before it."""
    window, length = 3, 12
    allowed = mask_matrix(sliding_window(window), *default_positions(length, length)).float()
    reach = torch.eye(length)
    for layers in range(1, 4):
        reach = (allowed @ reach).clamp(max=1)
        assert int(reach[-1].sum()) == 1 + layers * (window - 1)


@pytest.mark.parametrize("call, words", [
    (lambda: sliding_window(0), "window must be a positive integer"),
    (lambda: posenc.SlidingWindow(0), "window must be a positive integer"),
    (lambda: posenc.SlidingWindow(3, "rope"), "inner must be a posenc Scheme or None"),
    (lambda: posenc.SlidingWindow(3, posenc.SlidingWindow(2)), "inner must not be another masked scheme"),
    (lambda: posenc.KVCache("rope"), "scheme must be a posenc Scheme or None"),
    (lambda: posenc.KVCache().attend(torch.zeros(1, 1, 1, 4), [0]), "the cache is empty"),
])
def test_bad_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)
