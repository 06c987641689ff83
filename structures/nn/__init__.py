"""Structured attention layers (``nn.Module``), batch first, with padding given by ``lengths``."""

from .output import AttentionOutput
from .self_attention import StructuredSelfAttention

__all__ = ["AttentionOutput"]
__all__ += ["StructuredSelfAttention"]
