"""Reproductions, each runnable as ``python -m structures.experiments.NAME``."""
