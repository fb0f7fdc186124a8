"""posenc: positional encodings for Transformers, one attention core and three places
where position enters.

* the input (`posenc.input`): sinusoidal, learned and recurrent codes added to the
  embeddings;
* the queries and keys (`posenc.qk`): RoPE and its frequency rescalings, xPos, and RoPE
  over several position axes for images and video (axial 2-D RoPE, M-RoPE);
* the scores (`posenc.score`): ALiBi, T5 buckets, Shaw's relative keys and values, masks
  and windows.

`posenc.attention` composes any scheme with queries, keys and values on one of its
backends; `posenc.KVCache` decodes with it; `posenc.TinyTransformer` is a model that
takes any scheme by name, or one scheme per layer. `posenc.Layer` composes one layer's
recipe (RoPE, a mask, sink logits, a query temperature, a logit cap), and
`posenc.layer_schemes` builds every layer's from a transformers config (posenc.recipes).
Teaching measurements live in `posenc.desiderata`, the study and benchmark machinery in
`posenc.study`.
"""

from .core import BACKENDS, attention
from .cache import KVCache
from .device import default_device
from .layer import Layer
from .input import LearnedAbsolute, RecurrentAbsolute, Sinusoidal, sinusoidal_encoding
from .model import TinyTransformer, build_scheme
from .qk import (
    LAYOUTS,
    ROPE_TYPES,
    AxialRope,
    MRope,
    Rope,
    XPos,
    apply_rope,
    rope_frequencies,
)
from .recipes import layer_schemes
from .scheme import HOOKS, SCHEMES, NoPE, Scheme, make_scheme, register
from .score import (
    ALiBi,
    Masked,
    ShawRelative,
    SlidingWindow,
    T5Bias,
    alibi_slopes,
    t5_relative_bucket,
)
from .training import train

__version__ = "0.2.0"

__all__ = [
    "ALiBi",
    "AxialRope",
    "BACKENDS",
    "HOOKS",
    "KVCache",
    "LAYOUTS",
    "Layer",
    "LearnedAbsolute",
    "MRope",
    "Masked",
    "NoPE",
    "ROPE_TYPES",
    "RecurrentAbsolute",
    "Rope",
    "SCHEMES",
    "Scheme",
    "ShawRelative",
    "Sinusoidal",
    "SlidingWindow",
    "T5Bias",
    "TinyTransformer",
    "XPos",
    "alibi_slopes",
    "apply_rope",
    "attention",
    "build_scheme",
    "default_device",
    "layer_schemes",
    "make_scheme",
    "register",
    "rope_frequencies",
    "sinusoidal_encoding",
    "t5_relative_bucket",
    "train",
]
