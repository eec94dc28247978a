"""The build's one part pyproject.toml cannot state for setuptools 68: the optional C extension.

protocol/_records_native.c is the per-record loops of protocol/records.py in C. ``optional=True``: where it
cannot be compiled (no compiler, no Python headers) the install goes on without it and protocol.records runs
its pure-Python loops. An editable install (``pip install -e .``) builds it in place, next to its source.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "protocol._records_native",
            sources=["protocol/_records_native.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
