"""The optional C extensions (the potentials' value check, the spanning-tree decode's contraction loop, the matrix-tree
theorem's log Z and marginals, the compiler's Log and Max levels, the semirings' scans); the rest of the metadata is in pyproject.toml. Without a C compiler the
install goes on without them (numpy's decode and the torch path run). The kernel, the scans and the
matrix-tree theorem split a batch across the threads of OpenMP (those torch's own operations run on)
where the compiler has it, else run on one."""

import os
import subprocess
import sysconfig
import tempfile

from setuptools import Extension, setup


def openmp() -> list[str]:
    """``-fopenmp`` where the C compiler takes it: the kernel, the scans and the matrix-tree theorem
    then run their parts on the OpenMP runtime torch's own operations use (torch's wheel loads its
    libgomp before them), instead of POSIX threads that compete with torch's spinning workers."""
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "omp.c")
        with open(source, "w") as f:
            f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n")
        compiler = (sysconfig.get_config_var("CC") or "cc").split()
        try:
            built = subprocess.run([*compiler, "-fopenmp", source, "-o", os.path.join(tmp, "omp")], capture_output=True)
        except OSError:
            return []
    return ["-fopenmp"] if built.returncode == 0 else []


THREADS = openmp() if os.name == "posix" else []

setup(ext_modules=[
    Extension("structures._values", ["structures/_values.c"], optional=True, depends=["semiring/_vector.h"]),
    Extension("structures.spanning.decode._tarjan_c", ["structures/spanning/decode/_tarjan.c"], optional=True),
    Extension("structures.spanning._matrix_tree_c", ["structures/spanning/_matrix_tree_c.c"], optional=True,
              depends=["semiring/_vector.h", "semiring/_threads.h", "structures/spanning/_matrix_tree_tiles.h"], extra_compile_args=THREADS, extra_link_args=THREADS),
    Extension("semiring.language._kernel", ["semiring/language/_kernel.c"], optional=True, depends=["semiring/_vector.h"],
              extra_compile_args=THREADS, extra_link_args=THREADS),
    Extension("semiring._scan", ["semiring/_scan.c"], optional=True, depends=["semiring/_vector.h", "semiring/_threads.h"],
              extra_compile_args=THREADS, extra_link_args=THREADS),
])
