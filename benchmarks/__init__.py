"""Benchmarks against peer libraries (not tests): ``python -m benchmarks.chain``."""
