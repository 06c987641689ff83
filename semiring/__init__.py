"""Semirings and the rule language. Knows nothing about trees or tags."""

from .language import Program, ProgramError, program
from .language.limits import limits
from .semirings import (
    Count,
    Derivations,
    Expectation,
    KMax,
    Log,
    Max,
    Real,
    Sampled,
    SampledSemiring,
    Semiring,
    SignedLog,
)

__all__ = [
    "Count", "Derivations", "Expectation", "KMax", "Log", "Max", "Program", "ProgramError", "Real", "Sampled",
    "SampledSemiring", "Semiring", "SignedLog", "limits", "program",
]
