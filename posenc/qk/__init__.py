"""The query/key hook: a position-dependent rotation of queries and keys before their dot product.

RoPE and its frequency schedules (rope, rope_scaling), xPos (xpos), and RoPE over several
position axes for images and video: axial 2-D RoPE and Qwen2-VL's M-RoPE (axial).
"""

from .axial import AxialRope, MRope, grid_positions, mrope_positions
from .rope import LAYOUTS, ROPE_TYPES, Rope, apply_rope, rope_frequencies
from .xpos import XPos

__all__ = ["AxialRope", "LAYOUTS", "MRope", "ROPE_TYPES", "Rope", "XPos", "apply_rope", "grid_positions", "mrope_positions", "rope_frequencies"]
