"""The masks models ship, as posenc mask_mods: chunked (Llama 4), bidirectional windows (ModernBERT),
prefix LM (PaliGemma), causal with bidirectional blocks (Gemma 3's image tokens).

Each is cross-checked against the transformers mask function that builds it, runs on every backend
(FlexAttention's through its block mask), and decodes through KVCache as one full pass where the mask
allows decoding.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.score.masks import (
    Masked,
    and_masks,
    bidirectional_window,
    causal,
    causal_with_blocks,
    chunked,
    mask_matrix,
    prefix_lm,
)

hf_masks = pytest.importorskip("transformers.masking_utils")

BACKENDS = ("explicit", "sdpa", "flex_uncompiled")
INNERS = {"nope": lambda: None, "rope": lambda: posenc.Rope(8), "alibi": lambda: posenc.ALiBi(2)}


def hf_grid(mask_function, batch: int, q_len: int, k_len: int) -> torch.Tensor:
    """A transformers mask function evaluated on broadcast index grids: (batch, q_len, k_len)."""
    b = torch.arange(batch)[:, None, None]
    q = torch.arange(q_len)[None, :, None]
    k = torch.arange(k_len)[None, None, :]
    return torch.as_tensor(mask_function(b, 0, q, k)).expand(batch, q_len, k_len)


def posenc_grid(mod, positions: torch.Tensor) -> torch.Tensor:
    """A posenc mask_mod over per-row positions (batch, L): (batch, L, L)."""
    b = torch.arange(positions.shape[0])[:, None, None]
    return torch.as_tensor(mod(b, 0, positions[:, :, None], positions[:, None, :])).expand(positions.shape[0], positions.shape[1], positions.shape[1])


@pytest.mark.parametrize("chunk_size", [1, 3, 4])
def test_chunked_causal_is_transformers_with_left_padding(chunk_size):
    """HF counts chunks from each row's first real token (index - left_padding): posenc from position 0, the same thing."""
    left_padding, length = torch.tensor([0, 2, 5]), 11
    positions = torch.arange(length)[None, :] - left_padding[:, None]
    ours = posenc_grid(and_masks(causal, chunked(chunk_size)), positions)
    theirs = hf_grid(hf_masks.chunked_causal_mask_function(chunk_size, left_padding), 3, length, length)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("radius", [0, 1, 3, 20])
def test_bidirectional_window_is_transformers(radius):
    ours = mask_matrix(bidirectional_window(radius), torch.arange(12), torch.arange(12))
    theirs = hf_grid(hf_masks.sliding_window_bidirectional_mask_function(radius), 1, 12, 12)[0]
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("prefix_len", [1, 4, 9])
def test_prefix_lm_is_paligemmas_mask(prefix_len):
    """PaliGemma: block id 0 on the prefix (token_type_ids == 0), -1 on the suffix, ORed with causal."""
    length = 9
    block_ids = torch.where(torch.arange(length) < prefix_len, 0, -1)[None]
    theirs = hf_grid(hf_masks.or_masks(hf_masks.causal_mask_function, hf_masks.blockwise_overlay(block_ids)), 1, length, length)[0]
    assert torch.equal(mask_matrix(prefix_lm(prefix_len), torch.arange(length), torch.arange(length)), theirs)


def test_causal_with_blocks_is_gemma3s_mask():
    """Two rows with images at different places: ids from Gemma 3's own get_block_sequence_ids_for_mask."""
    from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

    token_type_ids = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0, 0, 0, 0, 0]])  # 1: image token
    block_ids = get_block_sequence_ids_for_mask(token_type_ids)
    theirs = hf_grid(hf_masks.or_masks(hf_masks.causal_mask_function, hf_masks.blockwise_overlay(block_ids)), 2, 10, 10)
    positions = torch.arange(10).expand(2, 10)
    assert torch.equal(posenc_grid(causal_with_blocks(block_ids), positions), theirs)


def _masked_case(name: str):
    """(scheme factory, causal flag, batch) for each mask family."""
    blocks = torch.tensor([[-1, 0, 0, 0, -1, 1, 1, -1, -1, -1], [-1, -1, -1, 0, 0, 0, 0, -1, -1, -1]])
    return {
        "chunked": (lambda inner: Masked(chunked(3), inner), True),
        "bidirectional_window": (lambda inner: Masked(bidirectional_window(2), inner), False),
        "prefix_lm": (lambda inner: Masked(prefix_lm(4), inner), False),
        "blocks_shared": (lambda inner: Masked(causal_with_blocks(blocks[0]), inner), False),
        "blocks_per_row": (lambda inner: Masked(causal_with_blocks(blocks), inner), False),
    }[name]


FAMILIES = ["chunked", "bidirectional_window", "prefix_lm", "blocks_shared", "blocks_per_row"]


@pytest.mark.parametrize("inner", list(INNERS))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_backend_agrees_and_follows_the_mask(family, inner):
    make, is_causal = _masked_case(family)
    scheme = make(INNERS[inner]())
    q, k, v = torch.randn(3, 2, 2, 10, 8).unbind(0)
    out, weights = posenc.attention(q, k, v, scheme, causal=is_causal, return_weights=True)
    allowed = scheme.mask_mod(torch.arange(2)[:, None, None, None], 0, torch.arange(10)[:, None], torch.arange(10)[None, :])
    allowed = allowed & causal(0, 0, torch.arange(10)[:, None], torch.arange(10)[None, :]) if is_causal else allowed
    assert torch.equal(weights > 0, allowed.expand(2, 2, 10, 10))
    for backend in BACKENDS[1:]:
        torch.testing.assert_close(posenc.attention(q, k, v, scheme, causal=is_causal, backend=backend), out)


@pytest.mark.parametrize("family", FAMILIES)
def test_flex_block_mask_is_the_dense_mask(family):
    """The block mask FlexAttention runs with, expanded to tokens, keeps every pair the dense mask allows and no other."""
    from posenc.kernel import block_mask, mask_table
    from posenc.positions import Positions

    make, is_causal = _masked_case(family)
    scheme = make(None)
    q = torch.randn(2, 1, 10, 8)
    positions = Positions.resolve(None, None, 10, 10, 2, q.device)
    blocks = block_mask(scheme, positions, is_causal, q, q, None)
    dense = mask_table(scheme, positions, is_causal, q.device)
    b, h, qi, ki = (torch.arange(n).view(*([1] * i), n, *([1] * (3 - i))) for i, n in enumerate((2, 1, 10, 10)))
    assert torch.equal(blocks.mask_mod(b, h, qi, ki).expand(2, 1, 10, 10), dense.expand(2, 1, 10, 10))


def test_prefix_lm_and_blocks_refuse_a_causal_call():
    q = torch.randn(1, 1, 6, 8)
    for mask in (prefix_lm(2), causal_with_blocks(torch.tensor([0, 0, -1, -1, -1, -1]))):
        with pytest.raises(ValueError, match="causal=False"):
            posenc.attention(q, q, q, Masked(mask))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: chunked(0), "chunk_size"),
        (lambda: bidirectional_window(-1), "radius"),
        (lambda: prefix_lm(0), "prefix_len"),
        (lambda: causal_with_blocks(torch.tensor([0, -2])), "block_ids"),
        (lambda: causal_with_blocks(torch.zeros(1, 2, 3, dtype=torch.long)), "block_ids"),
        (lambda: causal_with_blocks(torch.tensor([0.5, 1.0])), "block_ids"),
        (lambda: Masked(causal), "mask must be"),
        (lambda: Masked(chunked(2), inner="rope"), "inner"),
        (lambda: Masked(chunked(2), inner=posenc.SlidingWindow(2)), "inner"),
    ],
)
def test_bad_arguments_are_named(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_per_row_blocks_need_their_batch():
    scheme = Masked(causal_with_blocks(torch.zeros(3, 4, dtype=torch.long)))
    q = torch.randn(2, 1, 4, 8)
    with pytest.raises(ValueError, match="batch of 3"):
        posenc.attention(q, q, q, scheme, causal=False)


def _decode(scheme, q, k, v, chunks, is_causal):
    cache, outs, start = posenc.KVCache(scheme), [], 0
    for size in chunks:
        sl = slice(start, start + size)
        outs.append(cache.step(q[:, :, sl], k[:, :, sl], v[:, :, sl], torch.arange(start, start + size), causal=is_causal))
        start += size
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("inner", list(INNERS))
@pytest.mark.parametrize(
    "family, chunks",
    [
        ("chunked", [1] * 10),  # token by token
        ("chunked", [4, 3, 3]),
        ("prefix_lm", [4, 1, 1, 1, 1, 1, 1]),  # the prefix in one chunk, then token by token
        ("prefix_lm", [5, 5]),
        ("blocks_shared", [4, 3, 1, 1, 1]),  # every block inside one chunk
        ("blocks_per_row", [1, 6, 3]),
    ],
)
def test_decoding_equals_the_full_pass(family, chunks, inner):
    """Where each chunk holds whole blocks (the prefix, an image), a cache gives the full pass's outputs."""
    make, is_causal = _masked_case(family)
    scheme = make(INNERS[inner]())
    q, k, v = torch.randn(3, 2, 2, 10, 8).unbind(0)
    full = posenc.attention(q, k, v, scheme, causal=is_causal)
    torch.testing.assert_close(_decode(scheme, q, k, v, chunks, is_causal), full)


@settings(max_examples=40, deadline=None)
@given(
    chunk_size=st.integers(1, 6),
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    left_padding=st.lists(st.integers(0, 4), min_size=2, max_size=2),
    inner=st.sampled_from(list(INNERS)),
)
def test_chunked_prefill_in_any_chunks_with_padding_equals_the_full_pass(chunk_size, lengths, left_padding, inner):
    """Random chunkings of a left-padded batch: any prefill equals one pass, and each row equals itself run alone."""
    total = sum(lengths)
    positions = torch.arange(total)[None, :] - torch.tensor(left_padding)[:, None]
    real = (positions >= 0)[:, None, None, :]
    scheme = Masked(chunked(chunk_size), INNERS[inner]())
    q, k, v = torch.randn(3, 2, 2, total, 8).unbind(0)
    full = posenc.attention(q, k, v, scheme, mask=real, q_positions=positions, k_positions=positions)
    cache, outs, start = posenc.KVCache(scheme), [], 0
    for size in lengths:
        sl = slice(start, start + size)
        cache.append(k[:, :, sl], v[:, :, sl], positions[:, sl])
        outs.append(cache.attend(q[:, :, sl], positions[:, sl], mask=(cache.positions >= 0)[:, None, None, :]))
        start += size
    torch.testing.assert_close(torch.cat(outs, dim=2), full)
    for row in range(2):
        alone = posenc.attention(q[row : row + 1], k[row : row + 1], v[row : row + 1], scheme, mask=real[row : row + 1], q_positions=positions[row], k_positions=positions[row])
        torch.testing.assert_close(alone, full[row : row + 1])


SCHEMES_FOR_PROPERTIES = {
    "nope": lambda: None,
    "rope": lambda: posenc.Rope(8),
    "alibi": lambda: posenc.ALiBi(2),
    "t5": lambda: posenc.T5Bias(2, num_buckets=8, max_distance=16),
    "window_sinks_rope": lambda: posenc.SlidingWindow(3, posenc.Rope(8), num_sinks=1),
    "chunked_alibi": lambda: Masked(chunked(3), posenc.ALiBi(2)),
}


@settings(max_examples=60, deadline=None)
@given(
    scheme=st.sampled_from(list(SCHEMES_FOR_PROPERTIES)),
    documents=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=3), min_size=2, max_size=2),
    left_padding=st.lists(st.integers(0, 3), min_size=2, max_size=2),
    cuts=st.lists(st.integers(1, 4), min_size=1, max_size=12),
)
def test_packed_padded_rows_prefilled_in_any_chunks_equal_one_pass_and_each_row_alone(scheme, documents, left_padding, cuts):
    """Two rows, each left-padded and packed with its own documents, prefilled through KVCache in random chunks."""
    total = max(pad + sum(lengths) for lengths, pad in zip(documents, left_padding))
    positions = torch.stack([  # each row: its padding (negative positions), then its documents, each from 0
        torch.cat([torch.arange(-(total - sum(lengths)), 0)] + [torch.arange(n) for n in lengths]) for lengths in documents
    ])
    real = (positions >= 0)[:, None, None, :]
    made = SCHEMES_FOR_PROPERTIES[scheme]()
    q, k, v = torch.randn(3, 2, 2, total, 8).unbind(0)
    full = posenc.attention(q, k, v, made, mask=real, q_positions=positions, k_positions=positions)
    cache, outs, start = posenc.KVCache(made), [], 0
    for size in cuts + [total]:
        if start >= total:
            break
        sl = slice(start, min(start + size, total))
        cache.append(k[:, :, sl], v[:, :, sl], positions[:, sl])
        outs.append(cache.attend(q[:, :, sl], positions[:, sl], mask=(cache.positions >= 0)[:, None, None, :]))
        start = sl.stop
    seen = positions >= 0  # padded queries see nothing: zeros either way
    torch.testing.assert_close(torch.cat(outs, dim=2).transpose(1, 2)[seen], full.transpose(1, 2)[seen])
    for row in range(2):
        alone = posenc.attention(q[row : row + 1], k[row : row + 1], v[row : row + 1], made, mask=real[row : row + 1], q_positions=positions[row], k_positions=positions[row])
        torch.testing.assert_close(alone, full[row : row + 1])


@settings(max_examples=80, deadline=None)
@given(
    factory=st.sampled_from(["chunked", "bidirectional_window", "prefix_lm", "sliding_window"]),
    value=st.one_of(st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=2), st.none(), st.booleans(), st.just(torch.tensor(2))),
)
def test_bad_mask_arguments_get_a_named_error(factory, value):
    """Any argument either builds a mask or raises ValueError/TypeError naming the parameter, never a torch error."""
    names = {"chunked": "chunk_size", "bidirectional_window": "radius", "prefix_lm": "prefix_len", "sliding_window": "window"}
    make = {"chunked": chunked, "bidirectional_window": bidirectional_window, "prefix_lm": prefix_lm, "sliding_window": posenc.score.masks.sliding_window}[factory]
    try:
        mask = make(value)
    except (ValueError, TypeError) as exc:
        assert names[factory] in str(exc)
        return
    assert mask_matrix(mask, torch.arange(4), torch.arange(4)).dtype == torch.bool
