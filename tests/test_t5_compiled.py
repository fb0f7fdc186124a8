"""T5's buckets inside a compiled FlexAttention kernel (issue 31, t5 errata).

In float32 three of the encoder's distances (16, 32 and 64 with T5's 32 buckets and
max_distance 128) land exactly on a bucket boundary: a kernel whose logarithm or
division rounded one ulp lower would put them a bucket down. Each query sees 64 keys
with zero content and the identity as values, so the output is the attention
weights, the softmax of the bias; the queries sit at 0, 64, ..., 4032 and the keys at
0..63 (and the other way round), which meets every distance from 1 to 4032 once. The
table's entries differ by at least 0.1 between buckets, so one distance in a wrong
bucket moves a log-weight by as much. The same check runs in chapters/t5.ipynb, with
the compiled kernel where the chapter runs on a GPU.
"""

import pytest
import torch

import posenc
from posenc.core import cpu_compiles_flex

DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not cpu_compiles_flex(), reason="inductor cannot compile flex here"
        ),
    ),
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason="needs a GPU"
        ),
    ),
]


def _weights(t5, q_pos, k_pos, device, backend):
    H, L = t5.num_heads, len(q_pos)
    zeros = torch.zeros(1, H, L, L, device=device)
    identity = torch.eye(L, device=device).expand(1, H, L, L)
    with torch.no_grad():
        return posenc.attention(
            zeros,
            zeros,
            identity,
            t5,
            q_positions=q_pos.to(device),
            k_positions=k_pos.to(device),
            causal=False,
            scale=1.0,
            backend=backend,
        )[0]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_flex_keeps_the_boundary_distances_in_their_buckets(device):
    H, L = 2, 64
    table = 0.1 * torch.arange(32.0)[:, None] + 0.05 * torch.arange(H)
    spread, near = torch.arange(L) * L, torch.arange(L)
    # the CPU compiles slowly: the encoder's buckets only, where boundaries are exact
    modes = (True,) if device == "cpu" else (True, False)
    for bidirectional in modes:
        t5 = posenc.T5Bias(num_heads=H, bidirectional=bidirectional).to(device)
        with torch.no_grad():
            t5.table.copy_(table)
        for q_pos, k_pos in ((spread, near), (near, spread)):
            rel = k_pos[None, :] - q_pos[:, None]
            buckets = posenc.t5_relative_bucket(rel, bidirectional)  # on the CPU
            expected = table[buckets].permute(2, 0, 1).softmax(-1).log()
            for backend in ("flex", "explicit"):
                got = _weights(t5, q_pos, k_pos, device, backend).cpu().log()
                torch.testing.assert_close(got, expected, rtol=0, atol=0.01)
