import pytest
import torch

import posenc

# constructor arguments of every registered scheme, for tests that run them all
SCHEME_ARGS = {
    "nope": lambda head_dim, heads: {},
    "sinusoidal": lambda head_dim, heads: {"dim": head_dim},
    "rope": lambda head_dim, heads: {"head_dim": head_dim},
    "alibi": lambda head_dim, heads: {"num_heads": heads},
}
EXTRA_VARIANTS = [("rope", {"layout": "interleaved"}), ("rope", {"base": 500000.0})]


def every_scheme(head_dim: int = 16, heads: int = 4) -> list[posenc.Scheme]:
    schemes = [posenc.make_scheme(name, **SCHEME_ARGS[name](head_dim, heads)) for name in posenc.SCHEMES]
    schemes += [posenc.make_scheme(name, **SCHEME_ARGS[name](head_dim, heads), **extra) for name, extra in EXTRA_VARIANTS]
    return schemes


def scheme_id(s: posenc.Scheme) -> str:
    return f"{s.name}({s.extra_repr()})"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
