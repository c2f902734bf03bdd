"""The optional C speedups of the recorder's per-call path (prism_rr/_speedups.c).

Built where a compiler is present, as msgpack builds its own; where the build fails, the
install goes on without it and prism-rr runs its pure-Python twin (same bytes, slower).
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("prism_rr._speedups", ["prism_rr/_speedups.c"], optional=True,
                             extra_compile_args=["-O2"])])
