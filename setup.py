"""The optional C extension ``gpufleet._native`` (the default policy's descent measure; pyproject.toml holds the rest).

``optional=True``: where no C compiler is found, or the build fails, the install goes on without it and the policy
takes its numpy path (the same results).  ``python setup.py build_ext --inplace`` builds it next to the sources, for
runs with ``PYTHONPATH=src`` from a checkout; ``pip install -e .`` does the same.  docs/deploy.md says more.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """No contraction of ``a * b + c`` into a fused multiply-add: the C must round as numpy does (gcc and clang)."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off", "-fno-fast-math"]
        super().build_extensions()


setup(
    ext_modules=[Extension("gpufleet._native", ["src/gpufleet/_native.c"], optional=True)],
    cmdclass={"build_ext": BuildExt},
)
