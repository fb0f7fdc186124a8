import pytest
import torch

import posenc
from posenc import desiderata as des


def test_nope_fails_every_desideratum_the_expected_way():
    d = des.desiderata(posenc.NoPE(), train_len=16, test_len=64)
    assert d["distinct"] == 0.0  # every position looks the same
    assert d["decay"] == 0.5  # no trend with distance
    assert d["drift"] == 0.0  # nothing to drift
    assert d["far_weight"] == pytest.approx(48 / 64)  # uniform attention


@pytest.mark.parametrize("scheme", [posenc.Rope(64), posenc.Rope(64, layout="interleaved"), posenc.ALiBi(8)], ids=["rope", "rope-interleaved", "alibi"])
def test_relative_schemes_do_not_drift(scheme):
    d = des.desiderata(scheme, train_len=32, test_len=128)
    assert d["distinct"] > 0.01
    assert d["drift"] < 1e-5


def test_absolute_sinusoidal_drifts_past_the_training_length():
    d = des.desiderata(posenc.Sinusoidal(64), train_len=32, test_len=128)
    assert d["distinct"] > 0.01 and d["drift"] > 0.05


def test_alibi_similarity_falls_strictly_and_starves_far_keys():
    d = des.desiderata(posenc.ALiBi(8), train_len=64, test_len=256)
    assert d["decay"] == 1.0
    assert d["far_weight"] < des.desiderata(posenc.NoPE(), train_len=64, test_len=256)["far_weight"] / 2


def test_decay_score_reads_a_curve():
    assert des.decay_score(torch.tensor([3.0, 2.0, 1.0])) == 1.0
    assert des.decay_score(torch.tensor([1.0, 2.0, 3.0])) == 0.0
    assert des.decay_score(torch.tensor([1.0, 1.0, 1.0])) == 0.5


def test_similarity_by_distance_averages_diagonals():
    logits = torch.tensor([[[0.0, 9.0, 9.0], [1.0, 0.0, 9.0], [2.0, 3.0, 0.0]]])
    assert torch.allclose(des.similarity_by_distance(logits), torch.tensor([0.0, 2.0, 2.0]))


def test_position_logits_use_the_scheme_width_and_heads():
    assert des.position_logits(posenc.ALiBi(3), 10, dim=16).shape == (3, 10, 10)
    assert des.position_logits(posenc.Sinusoidal(32), 7).shape == (1, 7, 7)
    with pytest.raises(ValueError, match="dim=16 does not match"):
        des.position_logits(posenc.Sinusoidal(32), 7, dim=16)


def test_desiderata_needs_a_longer_test_length():
    with pytest.raises(ValueError, match="test_len must exceed train_len"):
        des.desiderata(posenc.NoPE(), train_len=64, test_len=64)


def test_a_sliding_window_puts_no_weight_past_it():
    windowed = des.desiderata(posenc.SlidingWindow(16, posenc.Rope(64)), train_len=64, test_len=256)
    plain = des.desiderata(posenc.Rope(64), train_len=64, test_len=256)
    assert windowed["far_weight"] == 0.0 < plain["far_weight"]
    assert {k: windowed[k] for k in ("distinct", "decay", "drift")} == {k: plain[k] for k in ("distinct", "decay", "drift")}


def test_a_window_takes_its_sizes_from_the_scheme_it_wraps():
    assert des.position_logits(posenc.SlidingWindow(4, posenc.ALiBi(3)), 10).shape == (3, 10, 10)
    assert des.desiderata(posenc.SlidingWindow(4, posenc.Rope(8)), 16, 32)["far_weight"] == 0.0


def test_diagonal_spread_is_zero_exactly_for_a_function_of_j_minus_i():
    i, j = torch.meshgrid(torch.arange(6.0), torch.arange(6.0), indexing="ij")
    assert des.diagonal_spread((j - i) ** 2) == 0.0
    assert des.diagonal_spread(i * j) > 0
    upper_noise = torch.triu(torch.rand(6, 6), diagonal=1)
    assert des.diagonal_spread(-(i - j).abs() + upper_noise, causal=True) == 0.0


def test_content_scale_scales_query_key_logits_but_not_a_bias():
    # RoPE's logits are c^2 u.R u / sqrt(d): they take the square of the content's scale
    rope = posenc.Rope(16)
    torch.testing.assert_close(
        des.position_logits(rope, 12, content_scale=2.0), 4 * des.position_logits(rope, 12)
    )
    # ALiBi adds the same u.u to every key of a query: its softmax weights do not move
    alibi = posenc.ALiBi(4)
    far = [des.far_attention(des.position_logits(alibi, 40, content_scale=c), 10) for c in (1.0, 3.0)]
    assert far[0] == pytest.approx(far[1], abs=1e-12)
    with pytest.raises(ValueError, match="content_scale"):
        des.position_logits(rope, 12, content_scale=0.0)
