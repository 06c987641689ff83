"""Structured attention layers (``nn.Module``), batch first, with padding masks."""
