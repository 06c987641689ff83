"""Structures built on the semiring language: each is a short declaration."""

from .chain import LinearChainCRF
from .constituency import ConstituencyCRF
from .distribution import StructuredDistribution
from .emission import EmissionCRF
from .hmm import HMM, HMMParameters
from .hops import HopChainCRF
from .nonprojective import NonProjectiveDependencyCRF
from .projective import ProjectiveDependencyCRF
from .second_order import SecondOrderDependencyCRF
from .semimarkov import SemiMarkovCRF

__all__ = [
    "ConstituencyCRF", "EmissionCRF", "HMM", "HMMParameters", "HopChainCRF", "LinearChainCRF", "NonProjectiveDependencyCRF", "ProjectiveDependencyCRF", "SecondOrderDependencyCRF", "SemiMarkovCRF",
    "StructuredDistribution",
]
