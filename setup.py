"""Builds kstore's Cython core: one extension module per concept. Metadata lives in pyproject.toml."""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# KSTORE_FUZZ_BUILD=1 turns on Cython bounds checks and sanitizers (see README, fuzzing).
fuzz = os.environ.get("KSTORE_FUZZ_BUILD") == "1"
directives = {"language_level": 3}
extra_compile_args = ["-O3"]
if fuzz:
    directives.update(boundscheck=True, wraparound=True, initializedcheck=True, overflowcheck=True)
    extra_compile_args = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined"]

# Every module and the C headers it includes; each module's .pxd (beside it) is picked up by
# cythonize. _core last: the package's entry, it imports (and re-exports) all the others.
MODULES = {
    "_crc": ["kstore/_crc.h"],
    "_mapping": ["kstore/_sigbus.h"],
    "_record": [],
    "_format": [],
    "_decode": [],
    "_scan": [],
    "_index_copy": [],
    "_listing": [],
    "_txn_scan": [],
    "_lines": [],
    "_column_input": [],
    "_encode": [],
    "_compact": ["kstore/_murmur3.h"],
    "_columnar": [],
    "_notify": ["kstore/_notify.h"],
    "_core": [],
}

extensions = [
    Extension(
        f"kstore.{name}",
        sources=[f"kstore/{name}.pyx"],
        depends=headers,
        include_dirs=["kstore", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=extra_compile_args,
        extra_link_args=["-fsanitize=address,undefined"] if fuzz else [],
    )
    for name, headers in MODULES.items()
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives, quiet=True))
