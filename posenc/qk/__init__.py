"""The query/key hook: a position-dependent rotation of queries and keys before their dot product."""

from .rope import LAYOUTS, ROPE_TYPES, Rope, apply_rope, rope_frequencies

__all__ = ["LAYOUTS", "ROPE_TYPES", "Rope", "apply_rope", "rope_frequencies"]
