"""What every attention layer returns."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from ..base import Distribution


class AttentionOutput(NamedTuple):
    """The result of an attention layer's forward pass.

    ``context``: what the layer computes (its shape is documented by each layer).
    ``attention``: the attention weights the context was built from (for structured layers, the
    marginals of the structure; zero at padded positions).
    ``distribution``: the structured distribution over the latent structure (``None`` for the
    unstructured baselines): ``distribution.decode()`` gives the best structure, and every other
    query of the distribution API is available for inspection.
    """

    context: Tensor
    attention: Tensor
    distribution: Distribution | None = None
