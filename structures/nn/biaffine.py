"""The scoring layers of a biaffine dependency parser (Dozat & Manning 2017): an ``MLP`` that maps
encoder states to head and dependent views, and a ``Biaffine`` arc scorer whose scores are the
structures' arc convention, ``scores[b, h, m]`` for head ``h`` -> modifier ``m``."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class MLP(nn.Sequential):
    """``x [..., in_dim]`` -> ``dropout(leaky_relu(x Wᵀ + b, 0.1)) [..., out_dim]``: one layer, as
    the biaffine parser's head and dependent views (SuPar's ``MLP``)."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0):
        super().__init__(nn.Linear(in_dim, out_dim), nn.LeakyReLU(0.1), nn.Dropout(dropout))


class Biaffine(nn.Module):
    """Arc scores ``scores[b, h, m] = dep_mᵀ U head_h + uᵀ head_h`` ``[B, N, N]`` of the head views
    ``head [B, N, D]`` and the dependent views ``dep [B, N, D]`` (``U`` is ``.weight [D, D]``, ``u``
    ``.bias [D]``: a head's prior, the same for every dependent). Both start at 0 (uniform scores), as
    in Dozat & Manning. The scores are what the dependency structures take (index 0 the root)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, head: Tensor, dep: Tensor) -> Tensor:
        return torch.einsum("bmi,ij,bhj->bhm", dep, self.weight, head) + (head @ self.bias).unsqueeze(-1)
