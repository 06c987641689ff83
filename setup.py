"""The optional C extension (the compiled spanning-tree decode); the rest of the metadata is in
pyproject.toml. Without a C compiler the install goes on without it (numpy's decode runs)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("structures.decode._tarjan_c", ["structures/decode/_tarjan.c"], optional=True)])
