"""The rule language: parse -> checked IR -> grounding -> schedule -> vectorized torch execution."""

from .program import Program, program
from .syntax import ProgramError

__all__ = ["Program", "ProgramError", "program"]
