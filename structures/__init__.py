"""Structures built on the semiring language: each is a short declaration."""

from .chain import LinearChainCRF
from .distribution import StructuredDistribution
from .hops import HopChainCRF
from .semimarkov import SemiMarkovCRF

__all__ = ["HopChainCRF", "LinearChainCRF", "SemiMarkovCRF", "StructuredDistribution"]
