"""Positions at the edges a practitioner reaches: negative positions (left padding), per-row sinks, empty chunks, ambiguous shapes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernel import bias_matrix
from posenc.score.masks import mask_matrix, sliding_window

LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 4, "factor": 4.0}
LENGTH_FOLLOWING = [{"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4}, LONGROPE]


def test_negative_positions_are_never_sinks():
    """The sinks are the positions 0..num_sinks-1; a left-padded row's negative positions are not among them."""
    mask = mask_matrix(sliding_window(2, num_sinks=1), torch.tensor([3]), torch.arange(-2, 4))
    assert mask.int().tolist() == [[0, 0, 1, 0, 1, 1]]


def test_a_rolling_cache_keeps_no_negative_position_as_a_sink():
    cache, k = posenc.KVCache(posenc.SlidingWindow(2, num_sinks=1)), torch.randn(1, 1, 20, 4)
    for t, position in enumerate(range(-10, 10)):  # token by token
        cache.append(k[:, :, t : t + 1], k[:, :, t : t + 1], torch.tensor([position]))
    assert cache.positions.tolist() == [0, 8, 9]  # the sink (position 0) and the window


@pytest.mark.parametrize("inner", [None, posenc.Rope(8), posenc.ALiBi(2)], ids=["nope", "rope", "alibi"])
@pytest.mark.parametrize("window, num_sinks", [(2, 1), (3, 2)])
def test_decoding_left_padded_rows_with_sinks_equals_the_full_pass(inner, window, num_sinks):
    """Each row keeps its own sinks: row 1's position 0 sits at another index than row 0's."""
    scheme = posenc.SlidingWindow(window, inner=inner, num_sinks=num_sinks)
    positions = torch.stack((torch.arange(0, 6), torch.arange(-2, 4)))  # row 1 is left-padded by two tokens
    padding = (positions >= 0)[:, None, None, :]  # keys at negative positions are padding
    q, k, v = torch.randn(3, 2, 2, 6, 8).unbind(0)
    full = posenc.attention(q, k, v, scheme, mask=padding, q_positions=positions, k_positions=positions)
    cache, steps = posenc.KVCache(scheme), []
    for t in range(6):
        cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1], positions[:, t : t + 1])
        seen = torch.zeros(2, 1, 1, len(cache), dtype=torch.bool)
        seen[..., :] = (cache.positions >= 0)[:, None, None, :]
        steps.append(cache.attend(q[:, :, t : t + 1], positions[:, t : t + 1], mask=seen))
    torch.testing.assert_close(torch.cat(steps, dim=2)[:, :, 2:], full[:, :, 2:])  # row 1's padded queries see nothing in either
    torch.testing.assert_close(torch.cat(steps, dim=2)[0], full[0])


@pytest.mark.parametrize("params", LENGTH_FOLLOWING, ids=["dynamic", "longrope"])
def test_an_empty_chunk_gives_an_empty_result(params):
    rope, empty = posenc.Rope(16, **params), torch.randn(1, 2, 0, 16)
    assert rope.transform_qk(empty, torch.arange(0)).shape == empty.shape
    assert posenc.attention(empty, empty, empty, rope).shape == empty.shape
    cache = posenc.KVCache(rope)
    cache.append(empty, empty, torch.arange(0))
    assert len(cache) == 0


@pytest.mark.parametrize("params", LENGTH_FOLLOWING, ids=["dynamic", "longrope"])
def test_positions_below_zero_use_the_frequencies_of_a_short_sequence(params):
    """As in Hugging Face: dynamic NTK does not grow and LongRoPE keeps its short factors (no error about a seq_len nobody passed)."""
    rope, x = posenc.Rope(16, **params), torch.randn(1, 2, 3, 16)
    torch.testing.assert_close(rope.frequencies_for(torch.arange(-5, -2)), rope.frequencies_for(torch.arange(1)))
    assert torch.isfinite(rope.transform_qk(x, torch.arange(-5, -2))).all()


@pytest.mark.parametrize("scheme", [posenc.MRope(16), posenc.AxialRope(16)], ids=["mrope", "axial"])
def test_per_row_positions_that_look_like_coordinates_are_refused_by_the_hook(scheme):
    batch = scheme.position_axes  # (batch, L) positions then have the shape of (axes, L) coordinates
    x = torch.randn(batch, 2, 5, 16)
    with pytest.raises(ValueError, match=f"ambiguous for {type(scheme).__name__} with a batch of {batch}"):
        scheme.transform_qk(x, torch.arange(5).expand(batch, 5))


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_coordinates_shared_by_the_batch_mean_the_same_for_any_batch(batch, seed):
    """posenc.attention passes (axes, L) coordinates on unambiguously, also when the batch has as many rows as axes."""
    gen = torch.Generator().manual_seed(seed)
    mrope, ids = posenc.MRope(16), posenc.qk.mrope_positions([2, (1, 1, 3)])
    x = torch.randn(batch, 2, 5, 16, generator=gen)
    out = posenc.attention(x, x, x, mrope, k_coords=ids)
    for row in range(batch):
        torch.testing.assert_close(out[row : row + 1], posenc.attention(x[row : row + 1], x[row : row + 1], x[row : row + 1], mrope, k_coords=ids))


def test_bias_matrix_names_the_shapes_it_takes():
    rows = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"bias_matrix takes 1-D positions, \(len\(q\),\) and \(len\(k\),\); got q_positions \(2, 3\)"):
        bias_matrix(posenc.ALiBi(2), rows, rows)


# --- packed documents ---------------------------------------------------------------------------------------------

PACKED_SCHEMES = [posenc.NoPE(), posenc.Rope(8), posenc.ALiBi(2), posenc.make_scheme("t5", num_heads=2, num_buckets=8, max_distance=12, init_std=0.5),
                  posenc.SlidingWindow(3, inner=posenc.Rope(8), num_sinks=1)]


def packing(lengths: list[int]) -> torch.Tensor:
    """Positions of documents of these lengths packed in one row: each restarts at 0."""
    return torch.cat([torch.arange(n) for n in lengths])


@pytest.mark.parametrize("scheme", PACKED_SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("backend", ["explicit", "sdpa", "flex_uncompiled"])
@pytest.mark.parametrize("causal", [True, False])
def test_packed_documents_attend_as_if_each_ran_alone(scheme, backend, causal):
    """Restarting positions isolate documents: a packed row gives each document's outputs of a run on its own."""
    rows = [[3, 5, 2], [6, 4]]  # two rows of 10 tokens, packed differently
    positions = torch.stack([packing(r) for r in rows])
    q, k, v = torch.randn(3, 2, 2, 10, 8).unbind(0)
    packed = posenc.attention(q, k, v, scheme, causal=causal, q_positions=positions, k_positions=positions, backend=backend)
    for b, lengths in enumerate(rows):
        start = 0
        for n in lengths:
            part = slice(start, start + n)
            alone = posenc.attention(q[b : b + 1, :, part], k[b : b + 1, :, part], v[b : b + 1, :, part], scheme, causal=causal, backend=backend)
            torch.testing.assert_close(packed[b : b + 1, :, part], alone, atol=2e-5, rtol=1e-5)
            start += n


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=4), min_size=1, max_size=3), window=st.integers(1, 5))
def test_the_packed_mask_is_hugging_faces(lengths, window):
    """posenc's mask equals transformers' packed-sequence mask (documents from restarting position ids) on the same rows."""
    pytest.importorskip("transformers")
    from transformers.masking_utils import (causal_mask_function, find_packed_sequence_indices, packed_sequence_compatibility_function,
                                            sliding_window_causal_mask_function)

    length = max(sum(r) for r in lengths)
    rows = [r + [length - sum(r)] if sum(r) < length else r for r in lengths]  # fill every row up with one more document
    positions = torch.stack([packing(r) for r in rows])
    documents = find_packed_sequence_indices(positions)
    if documents is None:  # one document per row: transformers keeps the plain mask
        documents = torch.zeros_like(positions)
    b, q_idx, kv_idx = torch.arange(len(rows))[:, None, None], torch.arange(length)[None, :, None], torch.arange(length)[None, None, :]
    resolved = posenc.positions.Positions.resolve(positions, positions, length, length, len(rows), torch.device("cpu"))
    for scheme, mask_fn in ((posenc.NoPE(), causal_mask_function), (posenc.SlidingWindow(window), sliding_window_causal_mask_function(window))):
        expected = packed_sequence_compatibility_function(mask_fn, positions, documents)(b, 0, q_idx, kv_idx)
        assert torch.equal(posenc.kernel.mask_table(scheme, resolved, True, "cpu")[:, 0], expected)


@pytest.mark.parametrize("scheme", PACKED_SCHEMES, ids=lambda s: s.name)
def test_decoding_a_packed_stream_through_the_cache_equals_the_full_pass(scheme):
    positions = packing([4, 3, 5])
    q, k, v = torch.randn(3, 1, 2, 12, 8).unbind(0)
    full = posenc.attention(q, k, v, scheme, q_positions=positions, k_positions=positions)
    cache, steps = posenc.KVCache(scheme), []
    for chunk in (slice(0, 2), slice(2, 5), slice(5, 6), slice(6, 12)):
        steps.append(cache.step(q[:, :, chunk], k[:, :, chunk], v[:, :, chunk], positions[chunk]))
    torch.testing.assert_close(torch.cat(steps, dim=2), full, atol=2e-5, rtol=1e-5)


def test_queries_outside_a_packed_stream_are_refused_by_name():
    q = torch.randn(1, 2, 2, 8)
    k = torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match="k_positions start again from 0 .* q_positions must be the last q_len = 2 of k_positions"):
        posenc.attention(q, k, k, q_positions=torch.tensor([0, 1]), k_positions=packing([3, 3]))


def test_positions_in_another_order_are_one_document():
    """Only restarts to 0 pack documents: scrambled positions (the chapters' relativity checks) keep one document."""
    assert posenc.positions.documents(torch.tensor([3, 7, 1, 0, 5])) is None
    assert posenc.positions.documents(torch.tensor([1, 1, 0, 1, 2])) is None  # Hugging Face's left padding (pads at 1)
    assert posenc.positions.documents(torch.tensor([[5, 6, 0, 1], [2, 9, 4, 0]])).tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]
