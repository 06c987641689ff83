"""Structures built on the semiring language: each is a short declaration."""

__version__ = "0.1.0"

from .alignment import AlignmentCRF
from .base import Distribution
from .chain import LinearChainCRF
from .constituency import ConstituencyCRF
from .ctc import CTC
from .distribution import StructuredDistribution
from .emission import EmissionCRF
from .hmm import HMM, HMMParameters
from .hops import HopChainCRF
from .spanning import NonProjectiveDependencyCRF
from .pcfg import PCFG, TDPCFG
from .projective import ProjectiveDependencyCRF
from .second_order import SecondOrderDependencyCRF
from .semimarkov import SemiMarkovCRF

__all__ = [
    "AlignmentCRF", "CTC", "ConstituencyCRF", "Distribution", "EmissionCRF", "HMM", "HMMParameters", "HopChainCRF", "LinearChainCRF", "NonProjectiveDependencyCRF", "PCFG", "ProjectiveDependencyCRF", "SecondOrderDependencyCRF", "SemiMarkovCRF",
    "StructuredDistribution", "TDPCFG", "__version__",
]
