"""The rule language: parse -> checked rules -> levels -> a plan per set of sizes -> one executor over strided views."""

from .program import Program, program
from .syntax import ProgramError

__all__ = ["Program", "ProgramError", "program"]
