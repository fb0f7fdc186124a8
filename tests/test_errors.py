"""Bad input gets a ValueError or TypeError that names the argument and what is accepted."""

import pytest
import torch

import posenc
from posenc.qk import rope as qk_rope
from posenc.qk import rope_forms
from posenc.input import sinusoidal

INV_FREQ = posenc.rope_frequencies(8)[0]
X = torch.randn(1, 2, 4, 8)

CASES = [
    # (call, exception, words the message must contain)
    (lambda: posenc.rope_frequencies(7), ValueError, "head_dim must be even"),
    (lambda: posenc.rope_frequencies(0), ValueError, "head_dim must be a positive integer"),
    (lambda: posenc.rope_frequencies(8.0), TypeError, "head_dim must be a positive integer"),
    (lambda: posenc.rope_frequencies(8, base=0.5), ValueError, "base must be a finite number"),
    (lambda: posenc.rope_frequencies(8, rope_type="nope"), ValueError, "rope_type must be one of 'default'"),
    (lambda: posenc.rope_frequencies(8, factor=2.0), TypeError, "rope_type 'default' does not accept ['factor']"),
    (lambda: posenc.apply_rope(torch.randn(4, 7), torch.arange(4), INV_FREQ), ValueError, "head_dim (x.shape[-1]) must be even"),
    (lambda: posenc.apply_rope(torch.randn(4, 6), torch.arange(4), INV_FREQ), ValueError, "x has last dimension 6, but inv_freq of length 4 needs 8"),
    (lambda: posenc.apply_rope(X, torch.arange(4), INV_FREQ, layout="neox"), ValueError, "layout must be one of 'half', 'interleaved'"),
    (lambda: posenc.apply_rope(X, torch.arange(5), INV_FREQ), ValueError, "positions of shape (5,) do not broadcast"),
    (lambda: posenc.apply_rope(X, torch.tensor([True, False, True, True]), INV_FREQ), TypeError, "positions must be real numbers"),
    (lambda: posenc.apply_rope(X, torch.tensor([0.0, 1.0, float("nan"), 3.0]), INV_FREQ), ValueError, "positions must be finite"),
    (lambda: posenc.apply_rope(X, torch.arange(4), INV_FREQ, attention_factor=0.0), ValueError, "attention_factor must be a finite number > 0"),
    (lambda: posenc.apply_rope(torch.randn(8), torch.arange(1), INV_FREQ), ValueError, "x must be a tensor of shape (..., seq_len, head_dim)"),
    (lambda: rope_forms.interleaved_to_half_permutation(5), ValueError, "head_dim must be even"),
    (lambda: posenc.sinusoidal_encoding(torch.arange(3), 0), ValueError, "dim must be a positive integer"),
    (lambda: posenc.sinusoidal_encoding(torch.arange(3), -4), ValueError, "dim must be a positive integer"),
    (lambda: posenc.sinusoidal_encoding("abc", 4), TypeError, "positions must be"),
    (lambda: sinusoidal.shift_rotation(1, 5), ValueError, "dim must be even"),
    (lambda: posenc.alibi_slopes(0), ValueError, "num_heads must be a positive integer"),
    (lambda: posenc.alibi_slopes(2.5), TypeError, "num_heads must be a positive integer"),
    (lambda: posenc.attention(X, X, X, posenc.ALiBi(2), q_positions=torch.tensor([0.5, 1, 2, 3]), k_positions=torch.arange(4)), TypeError, "q_positions must be integers"),
    (lambda: posenc.attention(X, X, X, q_positions=torch.zeros(3, 4, dtype=torch.long), k_positions=torch.zeros(3, 4, dtype=torch.long)), ValueError, "q_positions has 3 rows but q has batch 1"),
    (lambda: posenc.attention(X, X, X, q_positions=torch.zeros(1, 2, 4, dtype=torch.long)), ValueError, "q_positions must have shape (4,) or (batch, 4)"),
    (lambda: posenc.SlidingWindow(0), ValueError, "window must be a positive integer"),
    (lambda: posenc.SlidingWindow(4, num_sinks=6), ValueError, "num_sinks must not exceed the window"),
    (lambda: posenc.Rope(8, numerics="float16"), ValueError, "numerics must be one of 'float64', 'transformers'"),
    (lambda: posenc.attention(X, X, X, backend="flash"), ValueError, "backend must be one of 'explicit', 'sdpa', 'flex', 'flex_uncompiled'"),
    (lambda: posenc.attention(X[0], X[0], X[0]), ValueError, "q must have shape (batch, heads, seq_len, head_dim)"),
    (lambda: posenc.attention(X, X[:, :1], X[:, :1]), ValueError, "must agree on batch, heads and head_dim"),
    (lambda: posenc.attention(X, X, X[..., :3, :]), ValueError, "k and v must agree"),
    (lambda: posenc.attention(X, X, X, "rope"), TypeError, "scheme must be a posenc Scheme"),
    (lambda: posenc.attention(X, X, X, backend="sdpa", return_weights=True), ValueError, "return_weights=True needs backend='explicit'"),
    (lambda: posenc.attention(X, X, X, mask=torch.ones(4, 4)), TypeError, "mask must be a boolean tensor"),
    (lambda: posenc.attention(X, X, X, mask=torch.ones(3, 3, dtype=torch.bool)), ValueError, "mask of shape (3, 3) does not broadcast"),
    (lambda: posenc.attention(X, X, X, q_positions=torch.arange(3)), ValueError, "q_positions must have shape (4,) or (batch, 4)"),
    (lambda: posenc.attention(X, X, X, q_positions=torch.arange(4.0)), TypeError, "q_positions must be integers"),
    (lambda: posenc.attention(X, X[..., :2, :], X[..., :2, :]), ValueError, "q_len (4) must not exceed k_len (2)"),
    (lambda: posenc.make_scheme("t9"), ValueError, "name must be one of"),
    (lambda: posenc.Rope(8, layout="neox"), ValueError, "layout must be one of"),
    (lambda: posenc.Sinusoidal(0), ValueError, "dim must be a positive integer"),
    (lambda: posenc.ALiBi(-1), ValueError, "num_heads must be a positive integer"),
]


@pytest.mark.parametrize("call, exc, words", CASES, ids=[c[2] for c in CASES])
def test_bad_input_is_named(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


@pytest.mark.parametrize("scheme", [posenc.ALiBi(2), posenc.Rope(8), posenc.make_scheme("t5", num_heads=2), posenc.SlidingWindow(3, inner=posenc.Rope(8))], ids=lambda s: s.name)
def test_a_scheme_on_another_device_than_the_queries_is_named(scheme):
    """One rule for every scheme: its tensors sit on the queries' device; the error names the scheme, both devices and the fix."""
    q = torch.empty(1, 2, 4, 8, device="meta")  # another device than the scheme's CPU tables, without a GPU
    for call in (lambda: posenc.attention(q, q, q, scheme), lambda: posenc.KVCache(scheme).append(q, q, torch.arange(4))):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert f"scheme {scheme.name!r}" in message and "cpu" in message and "meta" in message and "scheme.to(q.device)" in message
    assert posenc.attention(X, X, X, scheme.to("cpu")).shape == X.shape  # on the queries' device it runs


def test_compiled_flex_on_a_cpu_that_cannot_compile_it_is_refused_by_name(monkeypatch):
    """Under ATEN_CPU_CAPABILITY=default (or without AVX2, or on macOS) inductor cannot lower FlexAttention for the CPU."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    q = torch.randn(1, 1, 8, 8)
    with torch.no_grad(), pytest.raises(ValueError, match="backend='flex_uncompiled'"):
        posenc.attention(q, q, q, posenc.SlidingWindow(2), backend="flex")
    assert posenc.attention(q, q, q, posenc.SlidingWindow(2), backend="flex_uncompiled").shape == q.shape
