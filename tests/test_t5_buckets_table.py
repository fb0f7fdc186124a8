"""T5's score_mod reads its buckets from a table made once (issue 30, item 7): bit for bit its former definition.

The former score_mod computed the bucket from the distance for every score (a logarithm and the bucket arithmetic);
now the bucket of each distance from -max_distance to max_distance is computed once, with the same function, and
every distance beyond is clamped to the last one, which shares its direction's last bucket. Equal integers give equal
table entries, so the bias and every output made from it are the same bits (the table's gradient sums the same terms,
in an order a scatter may change).
"""

import pytest
import torch

import posenc
from posenc.core import cpu_compiles_flex
from posenc.kernel import bias_matrix
from posenc.score.t5 import t5_relative_bucket
from posenc.study.bench_paths import ComputedT5

CONFIGS = [(True, 32, 128), (False, 32, 128), (True, 8, 20), (False, 16, 17), (True, 4, 3), (False, 2, 2)]


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", CONFIGS)
def test_the_table_gives_every_distance_its_computed_bucket(bidirectional, num_buckets, max_distance):
    t5 = posenc.T5Bias(4, num_buckets, max_distance, bidirectional=bidirectional)
    rel = torch.arange(-20_000, 20_001)
    near = rel.clamp(-max_distance, max_distance) + max_distance
    assert torch.equal(t5.buckets[near], t5_relative_bucket(rel, bidirectional, num_buckets, max_distance))
    assert t5.buckets.dtype == torch.long and "buckets" not in t5.state_dict()  # made again, not stored


@pytest.mark.parametrize("bidirectional", [True, False])
def test_the_bias_and_the_outputs_are_the_former_definition_bit_for_bit(bidirectional):
    torch.manual_seed(0)
    now = posenc.T5Bias(3, 32, 128, bidirectional=bidirectional, init_std=0.5)
    former = ComputedT5(3, 32, 128, bidirectional=bidirectional)
    former.load_state_dict(now.state_dict())
    positions = torch.arange(700)
    assert torch.equal(bias_matrix(now, positions, positions), bias_matrix(former, positions, positions))
    assert torch.equal(bias_matrix(now, positions[-5:] * 9, positions), bias_matrix(former, positions[-5:] * 9, positions))
    q, k, v, grad = (torch.randn(1, 3, 300, 16) for _ in range(4))
    causal = not bidirectional
    for backend in ("explicit", "sdpa"):
        outs = []
        for t5 in (now, former):
            t5.zero_grad()
            out = posenc.attention(q, k, v, t5, backend=backend, causal=causal)
            out.backward(grad)
            outs.append((out.detach(), t5.table.grad.clone()))
        assert torch.equal(outs[0][0], outs[1][0]), backend  # the outputs: the same bits
        # the table's gradient: the same terms, summed by a scatter whose order may differ
        torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        flex = [posenc.attention(q, k, v, t5, backend="flex_uncompiled", causal=causal) for t5 in (now, former)]
    assert torch.equal(*flex)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.skipif(not cpu_compiles_flex(), reason="inductor cannot compile flex here")
def test_compiled_flex_gives_the_former_outputs_bit_for_bit():
    torch.manual_seed(1)
    now = posenc.T5Bias(2, 32, 128, bidirectional=False, init_std=0.5)
    former = ComputedT5(2, 32, 128, bidirectional=False)
    former.load_state_dict(now.state_dict())
    q, k, v = (torch.randn(1, 2, 512, 16) for _ in range(3))
    with torch.no_grad():
        got = [posenc.attention(q, k, v, t5, backend="flex") for t5 in (now, former)]
    assert torch.equal(*got)
