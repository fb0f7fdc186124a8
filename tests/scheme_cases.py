"""Every registered scheme with small sizes, and variants, for tests that run them all."""

import posenc

# constructor arguments of every registered scheme, for tests that run them all
SCHEME_ARGS = {
    "nope": lambda head_dim, heads: {},
    "sinusoidal": lambda head_dim, heads: {"dim": head_dim},
    "rope": lambda head_dim, heads: {"head_dim": head_dim},
    "alibi": lambda head_dim, heads: {"num_heads": heads},
    "learned": lambda head_dim, heads: {"max_len": 64, "dim": head_dim},
    "recurrent": lambda head_dim, heads: {"dim": head_dim},
    "shaw": lambda head_dim, heads: {"head_dim": head_dim, "max_distance": 3, "values": False, "init_std": 0.5},
    "t5": lambda head_dim, heads: {"num_heads": heads, "num_buckets": 8, "max_distance": 12, "init_std": 0.5},
    "sliding_window": lambda head_dim, heads: {"window": 3, "inner": posenc.Rope(head_dim)},
    "xpos": lambda head_dim, heads: {"head_dim": head_dim},
    "axial_rope": lambda head_dim, heads: {"head_dim": head_dim, "grid_width": 3},  # 1-D positions read as a raster 3 patches wide
    "mrope": lambda head_dim, heads: {"head_dim": head_dim},  # 1-D positions are text: t = h = w
    "pixtral_rope": lambda head_dim, heads: {"head_dim": head_dim, "grid_width": 3},
}
EXTRA_VARIANTS = [
    ("rope", {"layout": "interleaved"}),
    ("rope", {"base": 500000.0}),
    ("shaw", {"values": True}),
    ("shaw", {"values": True, "method": "naive"}),
    ("t5", {"bidirectional": False}),
    ("rope", {"rope_type": "linear", "factor": 4.0}),
    ("rope", {"rope_type": "ntk", "factor": 4.0}),
    ("rope", {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 64}),
    ("rope", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
    ("rope", {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 8}),
    ("rope", {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5], "long_factor": [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0], "original_max_position_embeddings": 16, "factor": 4.0}),  # short factors within the tests' lengths
    ("rope", {"partial_rotary_factor": 0.5}),
    ("rope", {"partial_rotary_factor": 0.25, "layout": "interleaved"}),
    ("rope", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "partial_rotary_factor": 0.5}),
    ("xpos", {"layout": "interleaved", "scale_base": 8.0}),
    ("axial_rope", {"layout": "interleaved", "grid_width": 4}),
    ("axial_rope", {"grid_width": 4, "rope_type": "yarn", "factor": [2.0, 1.0], "original_max_position_embeddings": 4}),
    ("mrope", {"mrope_section": [4, 2, 2], "mrope_interleaved": True}),
    ("sliding_window", {"window": 3, "inner": posenc.XPos(16)}),
    ("sliding_window", {"window": 1}),
    ("sliding_window", {"window": 4, "inner": None}),
    ("sliding_window", {"window": 4, "inner": posenc.ALiBi(4)}),
]


def every_scheme(head_dim: int = 16, heads: int = 4) -> list[posenc.Scheme]:
    schemes = [posenc.make_scheme(name, **SCHEME_ARGS[name](head_dim, heads)) for name in posenc.SCHEMES]
    schemes += [posenc.make_scheme(name, **{**SCHEME_ARGS[name](head_dim, heads), **extra}) for name, extra in EXTRA_VARIANTS]
    return schemes


def scheme_id(s: posenc.Scheme) -> str:
    return f"{s.name}({s.extra_repr()})"

# backends that need no compiling: the wide agreement tests run on these; test_kernel.py compiles flex for a few cases
CHEAP_BACKENDS = ("explicit", "sdpa", "flex_uncompiled")
