"""The query/key hook: a position-dependent rotation of queries and keys.

The rotation happens before their dot product. RoPE (rope: the scheme; rotation: the
angles and the rotation of pairs; rope_scaling: the frequency schedules; rope_forms: the
same rotation written other ways), xPos (xpos), RoPE over several position axes for
images and video (multi_axis: what they share; axial: axial 2-D RoPE rescaled per axis
and Pixtral's 2-D RoPE; mrope: Qwen2-VL's M-RoPE), and where image and video tokens sit
in a sequence (vl_positions).
"""

from .axial import (
    AxialRope,
    MRope,
    PixtralRope,
    grid_positions,
    mrope_positions,
    per_axis_factors,
    per_axis_frequencies,
)
from .rope import LAYOUTS, ROPE_TYPES, Rope, apply_rope, rope_frequencies
from .vl_positions import (
    left_pad_position_ids,
    qwen2_5_vl_positions,
    qwen3_vl_positions,
    qwen3_vl_video_parts,
    row_break_positions,
)
from .xpos import XPos

__all__ = [
    "AxialRope",
    "LAYOUTS",
    "MRope",
    "PixtralRope",
    "ROPE_TYPES",
    "Rope",
    "XPos",
    "apply_rope",
    "grid_positions",
    "left_pad_position_ids",
    "mrope_positions",
    "per_axis_factors",
    "per_axis_frequencies",
    "qwen2_5_vl_positions",
    "qwen3_vl_positions",
    "qwen3_vl_video_parts",
    "rope_frequencies",
    "row_break_positions",
]
