"""The optional C extensions (the spanning-tree decode's contraction loop, the matrix-tree
theorem's log Z and marginals, the compiler's Log levels); the rest of the metadata is in pyproject.toml. Without a C compiler the
install goes on without them (numpy's decode and the torch path run). The compiler's kernel splits
a batch across threads with OpenMP where the compiler has it (else it runs on one thread)."""

import os
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

THREADED = "semiring.language._kernel"


def _accepts(compiler, flag: str) -> bool:
    """Whether ``compiler`` compiles and links an OpenMP program with ``flag``."""
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n")
        try:
            objects = compiler.compile([source], output_dir=tmp, extra_postargs=[flag])
            compiler.link_executable(objects, os.path.join(tmp, "probe"), extra_postargs=[flag])
        except Exception:  # noqa: BLE001 - any failure: build without it
            return False
    return True


class BuildExt(build_ext):
    def build_extensions(self):
        if self.compiler.compiler_type == "unix" and _accepts(self.compiler, "-fopenmp"):
            for ext in self.extensions:
                if ext.name == THREADED:
                    ext.extra_compile_args.append("-fopenmp")
                    ext.extra_link_args.append("-fopenmp")
        super().build_extensions()


setup(cmdclass={"build_ext": BuildExt}, ext_modules=[
    Extension("structures.decode._tarjan_c", ["structures/decode/_tarjan.c"], optional=True),
    Extension("structures._matrix_tree_c", ["structures/_matrix_tree_c.c"], optional=True),
    Extension(THREADED, ["semiring/language/_kernel.c"], optional=True),
])
