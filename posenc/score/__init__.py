"""The score hook: a bias added to the attention logits, or a mask on them."""

from .alibi import ALiBi, alibi_slopes
from .masks import (
    Mask,
    Masked,
    SlidingWindow,
    and_masks,
    bidirectional_window,
    causal,
    causal_with_blocks,
    chunked,
    mask_matrix,
    or_masks,
    prefix_lm,
    sliding_window,
)
from .relative import ShawRelative
from .t5 import T5Bias, t5_relative_bucket

__all__ = [
    "ALiBi",
    "Mask",
    "Masked",
    "ShawRelative",
    "SlidingWindow",
    "T5Bias",
    "alibi_slopes",
    "and_masks",
    "bidirectional_window",
    "causal",
    "causal_with_blocks",
    "chunked",
    "mask_matrix",
    "or_masks",
    "prefix_lm",
    "sliding_window",
    "t5_relative_bucket",
]
