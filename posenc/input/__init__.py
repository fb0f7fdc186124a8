"""The input hook: a code added to the token embeddings before the first layer."""

from .learned import LearnedAbsolute, RecurrentAbsolute
from .sinusoidal import Sinusoidal, sinusoidal_encoding

__all__ = ["LearnedAbsolute", "RecurrentAbsolute", "Sinusoidal", "sinusoidal_encoding"]
