"""The score hook: a bias added to the attention logits, or a mask on them."""

from .alibi import ALiBi, alibi_slopes
from .masks import SlidingWindow, and_masks, causal, mask_matrix, or_masks, sliding_window
from .relative import ShawRelative
from .t5 import T5Bias, t5_relative_bucket

__all__ = ["ALiBi", "ShawRelative", "SlidingWindow", "T5Bias", "alibi_slopes", "and_masks", "causal", "mask_matrix", "or_masks", "sliding_window", "t5_relative_bucket"]
