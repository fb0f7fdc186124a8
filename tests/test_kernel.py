"""Position inside the kernel: one definition per scheme, the forms derived from it, caches, chunked prefill, per-row positions."""

import pytest
import torch

import posenc
from posenc import core, kernel
from posenc.positions import Positions
from posenc.score.masks import mask_matrix
from scheme_cases import CHEAP_BACKENDS, every_scheme, scheme_id

SCHEMES = every_scheme()
TOL = {"atol": 2e-5, "rtol": 1e-5}


def qkv(batch=2, heads=4, q_len=10, k_len=10, head_dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, n, head_dim, generator=gen) for n in (q_len, k_len, k_len))


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s.hook == "score"], ids=scheme_id)
@pytest.mark.parametrize("layout", ["default", "offset", "per_row"])
def test_the_dense_bias_and_mask_are_the_one_definition_at_every_pair(scheme, layout):
    """Evaluated pair by pair on scalars, as a kernel calls them, the score_mod and mask_mod give the dense tables."""
    q, _, _ = qkv(q_len=6, k_len=6)
    given = {"default": (None, None), "offset": (torch.arange(50, 56), torch.arange(47, 53)), "per_row": (torch.tensor([[0, 1, 2, 3, 4, 5], [9, 10, 11, 12, 13, 14]]),) * 2}[layout]
    positions = Positions.resolve(*given, 6, 6, 2, q.device)
    bias = kernel.bias_table(scheme, positions, q)
    mask = kernel.mask_table(scheme, positions, True, q.device)
    score_mod = kernel.index_score_mod(scheme, positions, q)
    mask_mod = kernel.index_mask_mod(scheme, positions, True)
    for b in range(2):
        for h in range(4):
            for i in range(6):
                for j in range(6):
                    idx = [torch.tensor(n) for n in (b, h, i, j)]
                    if score_mod is not None:
                        expected = bias.expand(2, 4, 6, 6)[b, h, i, j]
                        assert torch.equal(score_mod(torch.tensor(0.0), *idx), expected)
                    assert bool(mask_mod(*idx)) == bool(mask.expand(2, 1, 6, 6)[b, 0, i, j])


def test_constant_tables_are_cached_and_learned_ones_are_not():
    q, _, _ = qkv()
    positions = Positions(10, 10)
    alibi, t5 = posenc.ALiBi(4), posenc.T5Bias(4, 8, 12)
    assert kernel.bias_table(alibi, positions, q) is kernel.bias_table(alibi, positions, q)
    assert kernel.bias_table(t5, positions, q) is not kernel.bias_table(t5, positions, q)  # it must see the table's current values
    window = posenc.SlidingWindow(3)
    assert kernel.mask_table(window, positions, True, "cpu") is kernel.mask_table(posenc.SlidingWindow(3, posenc.Rope(16)), positions, True, "cpu")
    rope = posenc.Rope(16)
    assert rope.cos_sin(range(10), q)[0].data_ptr() == rope.cos_sin(range(3, 10), q)[0].data_ptr() - 3 * 8 * 4  # a slice of one table


def test_sdpa_uses_is_causal_for_plain_causal_attention_and_builds_no_mask(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(core.F, "scaled_dot_product_attention", recording)
    monkeypatch.setattr(core, "mask_table", lambda *a: pytest.fail("a mask was built for plain causal attention"))
    q, k, v = qkv()
    for scheme in (None, posenc.Rope(16), posenc.Sinusoidal(16)):
        posenc.attention(q, k, v, scheme, backend="sdpa")
        posenc.attention(q, k, v, scheme, backend="sdpa", q_positions=torch.arange(10), k_positions=torch.arange(10))  # as TinyTransformer passes them
    assert calls == [(None, True)] * 6


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
@pytest.mark.parametrize("chunk", [1, 3, 4, 6])
def test_chunked_prefill_through_the_cache_equals_one_full_pass(scheme, backend, chunk):
    """Chunks of 1, 3, the window (4) and more than the window (6): every scheme, rolling where it has a window."""
    if scheme.needs_weights and backend != "explicit":
        pytest.skip("the value term runs on the explicit backend only")
    if getattr(scheme, "follows_length", False):
        pytest.skip("dynamic NTK changes its frequencies with the length: test_rope_scaling checks that trap")
    schemes = [scheme] + ([posenc.SlidingWindow(4, scheme)] if scheme.hook != "input" and scheme.window is None else [])
    schemes += [posenc.SlidingWindow(4, scheme.inner, num_sinks=2)] if isinstance(scheme, posenc.SlidingWindow) else []
    for s in schemes:
        q, k, v = qkv(q_len=17, k_len=17)
        full = posenc.attention(q, k, v, s, backend=backend)
        cache, outs = posenc.KVCache(s), []
        for start in range(0, 17, chunk):
            stop = min(start + chunk, 17)
            outs.append(cache.step(q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop], torch.arange(start, stop), backend=backend))
            if s.window is not None:
                assert len(cache) <= s.num_sinks + s.window - 1 + (stop - start)  # memory O(W + chunk)
        torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)


def test_sinks_stay_in_a_rolling_cache():
    scheme = posenc.SlidingWindow(4, posenc.Rope(16), num_sinks=2)
    cache = posenc.KVCache(scheme)
    q, k, v = qkv(q_len=20, k_len=20)
    for t in range(20):
        cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1], [t])
    assert cache.positions.tolist() == [0, 1, 16, 17, 18, 19]  # the two sinks, the W - 1 = 3 before the newest, the newest


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("backend", CHEAP_BACKENDS)
def test_positions_per_batch_row_equal_running_each_row_alone(scheme, backend):
    if scheme.needs_weights and backend != "explicit":
        pytest.skip("the value term runs on the explicit backend only")
    q, k, v = qkv(batch=3, q_len=7, k_len=7)
    rows = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [5, 6, 7, 8, 9, 10, 11], [-3, -2, 0, 1, 2, 3, 4]])  # the last: a left-padded row
    rows = rows.clamp(min=0)
    # a scheme with several position axes takes per-row positions as per-row coordinates (axes, batch, L)
    coords = {"k_coords": getattr(scheme, "inner", scheme).from_sequence(rows)} if scheme.position_axes > 1 else {}
    together = posenc.attention(q, k, v, scheme, q_positions=rows, k_positions=rows, backend=backend, **coords)
    for r in range(3):
        alone = posenc.attention(q[r : r + 1], k[r : r + 1], v[r : r + 1], scheme, q_positions=rows[r], k_positions=rows[r], backend=backend)
        torch.testing.assert_close(together[r : r + 1], alone, **TOL)


def test_a_model_takes_positions_per_row_for_left_padding():
    torch.manual_seed(0)
    model = posenc.TinyTransformer(16, dim=32, num_heads=2, scheme="rope").eval()
    tokens = torch.randint(0, 16, (2, 6))
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    padded = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    padded[1, ..., :2] = False
    with torch.no_grad():
        logits = model(tokens, positions, mask=padded)
        alone = model(tokens[1:, 2:])
    torch.testing.assert_close(logits[1:, 2:], alone, **TOL)


@pytest.mark.parametrize("layout", posenc.LAYOUTS)
def test_the_rotation_is_the_same_with_and_without_gradients(layout):
    x = torch.randn(2, 3, 5, 16)
    rope = posenc.Rope(16, layout=layout)
    with torch.no_grad():
        fast = rope.transform_qk(x, range(5))
    slow = rope.transform_qk(x.requires_grad_(), range(5))
    torch.testing.assert_close(fast, slow.detach(), atol=1e-6, rtol=1e-6)
    slow.sum().backward()
    assert x.grad is not None


def test_flex_on_the_cpu_says_it_cannot_train():
    q, k, v = (t.requires_grad_() for t in qkv())
    with pytest.raises(ValueError, match="FlexAttention has no backward pass on the CPU"):
        posenc.attention(q, k, v, posenc.ALiBi(4), backend="flex_uncompiled")
    with pytest.raises(ValueError, match="use backend='sdpa' or 'explicit'"):
        posenc.attention(*(t.detach() for t in (q, k, v)), posenc.T5Bias(4, 8, 12), backend="flex")  # its learned table needs a gradient


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_flex_runs_each_score_scheme_in_the_kernel():
    """One shape, compiled once per process: ALiBi, causal T5 and a window of 64 with RoPE inside (the compile-heavy test: kept to one)."""
    q, k, v = qkv(batch=1, heads=2, q_len=256, k_len=256)
    schemes = [posenc.ALiBi(2), posenc.T5Bias(2, 8, 32, bidirectional=False, init_std=0.5), posenc.SlidingWindow(64, posenc.Rope(16))]
    with torch.no_grad():
        for scheme in schemes:
            torch.testing.assert_close(posenc.attention(q, k, v, scheme, backend="flex"), posenc.attention(q, k, v, scheme), **TOL)


def test_dense_mask_helpers_read_the_same_definition():
    pos = torch.arange(12)
    window = posenc.SlidingWindow(5, num_sinks=1)
    expected = kernel.mask_table(window, Positions(12, 12), True, "cpu")[0, 0]
    assert torch.equal(mask_matrix(window.mask_mod, pos, pos), expected)
