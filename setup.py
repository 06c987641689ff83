"""The optional C extensions (the spanning-tree decode's contraction loop, the matrix-tree
theorem's log Z and marginals, the compiler's Log and Max levels, the semirings' scans); the rest of the metadata is in pyproject.toml. Without a C compiler the
install goes on without them (numpy's decode and the torch path run). The kernel, the scans and the
matrix-tree theorem split a batch across POSIX threads where there are (else they run on one)."""

import os

from setuptools import Extension, setup

THREADS = ["-pthread"] if os.name == "posix" else []

setup(ext_modules=[
    Extension("structures.spanning.decode._tarjan_c", ["structures/spanning/decode/_tarjan.c"], optional=True),
    Extension("structures.spanning._matrix_tree_c", ["structures/spanning/_matrix_tree_c.c"], optional=True,
              depends=["semiring/_vector.h", "semiring/_threads.h"], extra_compile_args=THREADS, extra_link_args=THREADS),
    Extension("semiring.language._kernel", ["semiring/language/_kernel.c"], optional=True, depends=["semiring/_vector.h"],
              extra_compile_args=THREADS, extra_link_args=THREADS),
    Extension("semiring._scan", ["semiring/_scan.c"], optional=True, depends=["semiring/_vector.h", "semiring/_threads.h"],
              extra_compile_args=THREADS, extra_link_args=THREADS),
])
