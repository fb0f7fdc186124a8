"""posenc: positional encodings for Transformers, one attention core and three places where position enters.

The input (sinusoidal), the queries and keys (RoPE), the scores (ALiBi): see
`posenc.schemes` for the hooks, `posenc.attention` for the entry point and its
backends, and `posenc.desiderata` for the measurements every chapter reports.
"""

from .alibi import alibi_bias, alibi_slopes, relative_distance
from .attention import BACKENDS, attention, attention_logits
from .desiderata import (
    content_vector,
    decay_score,
    desiderata,
    diagonal_spread,
    distinctness,
    far_attention,
    position_logits,
    similarity_by_distance,
    window_drift,
)
from .cache import KVCache
from .masks import causal_mask, default_positions, sliding_window_mask, window_mask, window_mask_mod, window_mask_with_sinks
from .memory import cuda_peak_memory, peak_memory
from .results import read_result
from .tasks import lag_copy, lag_copy_batches
from .model import Block, TinyTransformer, build_scheme, train
from .relative import (
    clipped_relative_index,
    shaw_key_scores,
    shaw_relative_index,
    shaw_value_term,
    skew,
    t5_relative_bucket,
    transformer_xl_logits,
)
from .rope_scaling import default_inv_freq64, ntk_base, yarn_correction_dim, yarn_mscale, yarn_ramp
from .rope import (
    LAYOUTS,
    ROPE_TYPES,
    apply_rope,
    apply_rope_angles,
    apply_rope_complex,
    interleaved_to_half_permutation,
    rope_angles,
    rope_decay_bound,
    rope_frequencies,
    rope_parameters,
    rope_rotation_matrix,
    rotate_half,
    rotate_interleaved,
)
from .schemes import (
    HOOKS,
    SCHEMES,
    ALiBi,
    LearnedAbsolute,
    NoPE,
    RecurrentAbsolute,
    Rope,
    Scheme,
    ShawRelative,
    Sinusoidal,
    SlidingWindow,
    T5Bias,
    make_scheme,
)
from .sinusoidal import (
    input_logit_terms,
    shift_rotation,
    sinusoidal_angles,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_wavelengths,
)
from .device import default_device

__version__ = "0.1.0"

__all__ = [
    "ALiBi",
    "BACKENDS",
    "Block",
    "HOOKS",
    "KVCache",
    "LAYOUTS",
    "LearnedAbsolute",
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
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_rope_angles",
    "apply_rope_complex",
    "attention",
    "attention_logits",
    "build_scheme",
    "causal_mask",
    "clipped_relative_index",
    "content_vector",
    "cuda_peak_memory",
    "decay_score",
    "default_device",
    "default_inv_freq64",
    "default_positions",
    "desiderata",
    "diagonal_spread",
    "distinctness",
    "far_attention",
    "input_logit_terms",
    "interleaved_to_half_permutation",
    "lag_copy",
    "lag_copy_batches",
    "make_scheme",
    "ntk_base",
    "peak_memory",
    "position_logits",
    "read_result",
    "relative_distance",
    "rope_angles",
    "rope_decay_bound",
    "rope_frequencies",
    "rope_parameters",
    "rope_rotation_matrix",
    "rotate_half",
    "rotate_interleaved",
    "shaw_key_scores",
    "shaw_relative_index",
    "shaw_value_term",
    "shift_rotation",
    "similarity_by_distance",
    "sinusoidal_angles",
    "sinusoidal_encoding",
    "sinusoidal_frequencies",
    "sinusoidal_wavelengths",
    "skew",
    "sliding_window_mask",
    "t5_relative_bucket",
    "train",
    "transformer_xl_logits",
    "window_drift",
    "window_mask",
    "window_mask_mod",
    "window_mask_with_sinks",
    "yarn_correction_dim",
    "yarn_mscale",
    "yarn_ramp",
]
