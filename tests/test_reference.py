"""Cross-checks against Hugging Face transformers (pinned), live and from frozen values."""

import math

import pytest
import torch
from torch.utils import _pytree as pytree

import hf_reference as ref
from hf_reference import HAVE_HF, hf, tensor  # noqa: F401 (hf is a fixture)
import posenc



@pytest.mark.parametrize("n_pos, dim", ref.SINUSOIDAL_CASES)
def test_sinusoidal_table_equals_distilbert(hf, n_pos, dim):
    ours = posenc.sinusoidal_encoding(torch.arange(n_pos), dim)
    torch.testing.assert_close(ours, tensor(hf["sinusoidal"][f"{n_pos}x{dim}"]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("head_dim, base", ref.ROPE_CASES)
def test_rope_inv_freq_equals_llama(hf, head_dim, base):
    inv_freq, factor = posenc.rope_frequencies(head_dim, base)
    # HF raises base to a float32 exponent; posenc rounds the float64 value: a few float32 ulps apart
    torch.testing.assert_close(inv_freq, tensor(hf["rope_inv_freq"][f"{head_dim}@{base:g}"]), atol=0, rtol=1e-6)
    assert factor == 1.0


def test_rope_half_equals_llama_apply_rotary_pos_emb(hf):
    x = ref.rotation_input()
    ours = posenc.apply_rope(x, torch.tensor(ref.ROTATION_POSITIONS), posenc.rope_frequencies(8)[0], "half")
    torch.testing.assert_close(ours, tensor(hf["rope_half"]), atol=2e-6, rtol=1e-6)


def test_rope_interleaved_equals_gptj(hf):
    x = ref.rotation_input()
    ours = posenc.apply_rope(x, torch.tensor(ref.ROTATION_POSITIONS), posenc.rope_frequencies(8)[0], "interleaved")
    torch.testing.assert_close(ours, tensor(hf["rope_interleaved"]), atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("num_heads", ref.ALIBI_HEADS)
def test_alibi_slopes_equal_bloom(hf, num_heads):
    # BLOOM takes float32 powers of a float32 base (error grows with the power, ~2e-6 at 256 heads);
    # posenc rounds the float64 value once (test_alibi checks that exactly)
    torch.testing.assert_close(posenc.alibi_slopes(num_heads), tensor(hf["alibi_slopes"][str(num_heads)]), atol=0, rtol=4e-6)


@pytest.mark.skipif(not HAVE_HF, reason="transformers not installed")
def test_frozen_values_are_those_of_the_pinned_transformers():
    """The frozen file is what the pinned release computes, to the last bits that another CPU code path changes.

    transformers forms some values with float32 vector code (BLOOM's slopes are float32 powers), whose last bit
    differs between AVX-512 and AVX2: within 1e-6 relative, the same values.
    """
    live, frozen = ref.compute(), ref.frozen()
    assert frozen["transformers"] == live["transformers"], "re-freeze: python tests/hf_reference.py"
    flat_live, live_shape = pytree.tree_flatten(live)
    flat_frozen, frozen_shape = pytree.tree_flatten(frozen)
    assert frozen_shape == live_shape, "re-freeze: python tests/hf_reference.py"
    for got, want in zip(flat_frozen, flat_live):
        assert got == want if not isinstance(want, float) else math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12), (got, want)


@pytest.mark.skipif(not HAVE_HF, reason="transformers not installed")
def test_sinusoidal_table_equals_distilbert_at_bert_size():
    """The 512 x 768 table of a BERT-sized model, compared live (too big to freeze)."""
    torch.testing.assert_close(posenc.sinusoidal_encoding(torch.arange(512), 768), ref.sinusoidal(512, 768), atol=1e-6, rtol=0)


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance", ref.T5_CASES)
def test_t5_buckets_equal_t5attention(hf, bidirectional, num_buckets, max_distance):
    rel = torch.arange(*ref.T5_RANGE)
    ours = posenc.t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)
    assert ours.tolist() == hf["t5_buckets"][f"{bidirectional}/{num_buckets}/{max_distance}"]


@pytest.mark.skipif(not HAVE_HF, reason="transformers not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_rotation_is_llamas_bit_for_bit_with_the_same_cos_and_sin(dtype):
    """Products rounded before the sum, as q * cos + rotate_half(q) * sin: the same bits in float32 and bf16."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    q = torch.randn(1, 2, 50, 64).to(dtype)
    rope = posenc.Rope(64, numerics="transformers")
    cos, sin = rope.cos_sin(range(50), q)
    expected = apply_rotary_pos_emb(q, q, torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None])[0]
    assert torch.equal(rope.transform_qk(q, range(50)), expected)
    assert torch.equal(posenc.apply_rope(q, torch.arange(50), rope.inv_freq), expected)
