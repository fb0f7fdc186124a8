import math
import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernel import bias_matrix
from posenc.positions import relative_distance
from posenc.score.masks import causal, mask_matrix
from posenc.score import relative
from posenc import desiderata as des

HAVE_HF = importlib.util.find_spec("transformers") is not None


# --- T5 buckets -------------------------------------------------------------------------------

@pytest.mark.skipif(not HAVE_HF, reason="transformers not installed")
@settings(max_examples=60, deadline=None)
@given(
    half=st.integers(2, 64), bidirectional=st.booleans(), extra=st.integers(1, 2000),
    rel=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=50),
)
def test_t5_buckets_equal_hugging_face_for_any_input(half, bidirectional, extra, rel):
    from transformers.models.t5.modeling_t5 import T5Attention

    num_buckets = 2 * half
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = max_exact + extra
    rel = torch.tensor(rel)
    expected = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert torch.equal(posenc.t5_relative_bucket(rel, bidirectional, num_buckets, max_distance), expected)


@settings(max_examples=40, deadline=None)
@given(bidirectional=st.booleans(), half=st.integers(2, 32), extra=st.integers(1, 300))
def test_t5_buckets_are_monotone_in_distance_and_saturate(bidirectional, half, extra):
    num_buckets = 2 * half
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = max_exact + extra
    distance = torch.arange(0, 3 * max_distance)
    back = posenc.t5_relative_bucket(-distance, bidirectional, num_buckets, max_distance)  # keys before the query
    assert bool((back[1:] >= back[:-1]).all())
    assert torch.equal(back[:max_exact], distance[:max_exact])  # exact for small distances
    last = (num_buckets // 2 if bidirectional else num_buckets) - 1
    assert bool((back[max_distance:] == last).all())  # every long distance shares the last bucket
    ahead = posenc.t5_relative_bucket(distance, bidirectional, num_buckets, max_distance)
    if bidirectional:
        assert torch.equal(ahead[1:], back[1:] + num_buckets // 2)  # keys after the query get their own half
    else:
        assert bool((ahead == 0).all())  # a decoder maps the future to bucket 0


def test_t5_default_bucket_map():
    """32 buckets, 16 per direction: distances 0-7 exact, then 8 + 8 log(n / 8) / log(128 / 8), capped at 15."""
    rel = torch.tensor([0, -1, -7, -8, -16, -64, -127, -128, -10**5, 1, 16])
    assert posenc.t5_relative_bucket(rel).tolist() == [0, 1, 7, 8, 10, 14, 15, 15, 15, 17, 26]


def test_t5_bias_is_one_scalar_per_bucket_and_head():
    t5 = posenc.T5Bias(num_heads=3, num_buckets=8, max_distance=16)
    bias = bias_matrix(t5, torch.arange(20), torch.arange(20))
    assert bias.shape == (3, 20, 20)
    buckets = posenc.t5_relative_bucket(relative_distance(torch.arange(20), torch.arange(20)), True, 8, 16)
    for h in range(3):
        assert torch.equal(bias[h], t5.table[buckets, h])
    assert sum(p.numel() for p in t5.parameters()) == 8 * 3


# --- Shaw et al. ----------------------------------------------------------------------------

def test_shaw_index_is_clipped_relative_distance_shifted():
    index = relative.shaw_relative_index(4, 6, 2)
    # queries are positions 2..5, keys 0..5
    expected = [[max(-2, min(2, j - i)) + 2 for j in range(6)] for i in range(2, 6)]
    assert index.tolist() == expected


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 40), k=st.integers(1, 10))
def test_clipping_makes_the_index_constant_past_max_distance(length, k):
    index = relative.shaw_relative_index(length, length, k)
    assert int(index.min()) >= 0 and int(index.max()) <= 2 * k
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    assert bool((index[(j - i) >= k] == 2 * k).all()) and bool((index[(j - i) <= -k] == 0).all())


@pytest.mark.parametrize("q_len, k_len", [(7, 7), (1, 9), (3, 12)])
def test_naive_and_gather_agree(q_len, k_len):
    q = torch.randn(2, 3, q_len, 8, dtype=torch.float64)
    weights = torch.rand(2, 3, q_len, k_len, dtype=torch.float64)
    table_k, table_v = torch.randn(2, 9, 8, dtype=torch.float64)
    index = relative.shaw_relative_index(q_len, k_len, 4)
    torch.testing.assert_close(relative.shaw_key_scores(q, table_k, index, "gather"), relative.shaw_key_scores(q, table_k, index, "naive"))
    torch.testing.assert_close(relative.shaw_value_term(weights, table_v, index, "gather"), relative.shaw_value_term(weights, table_v, index, "naive"))


def test_shaw_attention_is_the_papers_equations():
    """e_ij = q_i (k_j + a^K_ij) / sqrt(d); z_i = sum_j alpha_ij (v_j + a^V_ij)."""
    torch.manual_seed(0)
    shaw = posenc.ShawRelative(head_dim=4, max_distance=2, init_std=1.0)
    q, k, v = torch.randn(3, 1, 1, 5, 4)
    out, weights = posenc.attention(q, k, v, shaw, return_weights=True)
    index = relative.shaw_relative_index(5, 5, 2)
    a_k, a_v = shaw.key_table[index], shaw.value_table[index]  # (5, 5, 4)
    e = torch.einsum("id,ijd->ij", q[0, 0], k[0, 0][None] + a_k) / 2.0
    e = e.masked_fill(~mask_matrix(causal, torch.arange(5), torch.arange(5)), float("-inf"))
    alpha = e.softmax(-1)
    z = torch.einsum("ij,ijd->id", alpha, v[0, 0][None] + a_v)
    torch.testing.assert_close(weights[0, 0], alpha)
    torch.testing.assert_close(out[0, 0], z)


def test_shaw_bias_reads_the_queries_and_equals_the_naive_construction():
    """The one definition (a score_mod over the 2k + 1 per-query products) equals the paper's (L, L, d) form."""
    torch.manual_seed(0)
    shaw = posenc.ShawRelative(8, max_distance=2, values=False, init_std=0.5)
    q = torch.randn(2, 3, 7, 8)
    pos = torch.arange(7)
    naive = relative.shaw_key_scores(q, shaw.key_table, relative.clipped_relative_index(pos, pos, 2), "naive") / math.sqrt(8)
    torch.testing.assert_close(bias_matrix(shaw, pos, pos, q=q), naive)


# --- skewing and Transformer-XL ---------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(length=st.integers(1, 20), seed=st.integers(0, 1000))
def test_skew_equals_a_gather_below_the_diagonal(length, seed):
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.randn(2, length, 6, generator=gen, dtype=torch.float64)  # r row c: distance L - 1 - c
    skewed = relative.skew(q @ r.T)
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    gathered = (q[:, None, :] * r[length - 1 - (i - j).clamp(min=0)]).sum(-1)
    causal = j <= i
    assert torch.allclose(skewed[causal], gathered[causal])


def test_transformer_xl_terms():
    torch.manual_seed(0)
    length, d = 6, 8
    q, k = torch.randn(2, 2, length, d, dtype=torch.float64)
    distances = torch.arange(length - 1, -1, -1)
    r = posenc.sinusoidal_encoding(distances, d, dtype=torch.float64) @ torch.randn(d, d, dtype=torch.float64)
    u, v = torch.randn(2, d, dtype=torch.float64)
    terms = relative.transformer_xl_logits(q, k, r, u, v)
    i, j = 4, 1
    r_ij = r[length - 1 - (i - j)]
    assert torch.allclose(terms["a"][:, i, j], (q[:, i] * k[:, j]).sum(-1))
    assert torch.allclose(terms["b"][:, i, j], q[:, i] @ r_ij)
    assert torch.allclose(terms["c"][:, i, j], k[:, j] @ u)
    assert torch.allclose(terms["d"][:, i, j], (v @ r_ij).expand(2))
    # (b) + (d) = (q_i + v) . r_{i-j}: depends on the query's content and on i - j only
    assert torch.allclose(terms["d"][:, 5, 2], terms["d"][:, 4, 1])


# --- learned and recurrent absolute positions -------------------------------------------------

def test_learned_table_has_no_row_past_max_len():
    learned = posenc.LearnedAbsolute(max_len=8, dim=4)
    assert torch.equal(learned.embed(torch.arange(8)), learned.table)
    with pytest.raises(ValueError, match=r"position 8 is outside the learned table: positions must be in \[0, max_len=8\)"):
        learned.embed(torch.arange(9))
    with pytest.raises(ValueError, match="position -1 is outside"):
        learned.embed(torch.tensor([-1, 2]))


def test_learned_desiderata_past_the_table_raise():
    with pytest.raises(ValueError, match="outside the learned table"):
        des.desiderata(posenc.LearnedAbsolute(max_len=64, dim=16), train_len=64, test_len=128)


def test_recurrent_positions_follow_their_recurrence_past_any_length():
    rec = posenc.RecurrentAbsolute(dim=4, init_std=0.5)
    codes = rec.embed(torch.arange(300))
    assert codes.shape == (300, 4)
    torch.testing.assert_close(codes[1], codes[0] + torch.tanh(rec.step(codes[0])))
    torch.testing.assert_close(rec.embed(torch.tensor([299, 3])), codes[[299, 3]])


@pytest.mark.parametrize("call, words", [
    (lambda: posenc.t5_relative_bucket(torch.arange(3), num_buckets=31), "num_buckets must be even"),
    (lambda: posenc.t5_relative_bucket(torch.arange(3), num_buckets=0), "num_buckets must be a positive integer"),
    (lambda: posenc.t5_relative_bucket(torch.arange(3), num_buckets=2), "num_buckets must be at least 4"),
    (lambda: posenc.t5_relative_bucket(torch.arange(3), max_distance=0), "max_distance must be a positive integer"),
    (lambda: posenc.t5_relative_bucket(torch.arange(3), max_distance=8), "max_distance must exceed the 8 exact buckets"),
    (lambda: posenc.t5_relative_bucket(torch.tensor([0.5])), "relative_position must be integers"),
    (lambda: posenc.T5Bias(4, num_buckets=7), "num_buckets must be even"),
    (lambda: relative.shaw_relative_index(3, 3, 0), "max_distance must be a positive integer"),
    (lambda: relative.shaw_relative_index(4, 3, 2), "q_len (4) must not exceed k_len (3)"),
    (lambda: posenc.ShawRelative(8, max_distance=0), "max_distance must be a positive integer"),
    (lambda: posenc.ShawRelative(8, method="skewed"), "method must be one of 'gather', 'naive'"),
    (lambda: posenc.LearnedAbsolute(0, 8), "max_len must be a positive integer"),
    (lambda: posenc.LearnedAbsolute(8, 8).embed(torch.tensor([1.5])), "positions must be integers"),
    (lambda: relative.skew(torch.zeros(3, 4)), "must be square"),
])
def test_bad_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError), match=words.replace("(", r"\(").replace(")", r"\)")):
        call()
