"""Structured attention layers (``nn.Module``), batch first, with padding given by ``lengths``."""

from .output import AttentionOutput

__all__ = ["AttentionOutput"]
