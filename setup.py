"""Builds kstore's Cython core. Metadata lives in pyproject.toml."""
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

ext = Extension(
    "kstore._core",
    sources=["kstore/_core.pyx"],
    depends=["kstore/_kstore.h"],
    include_dirs=["kstore", numpy.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=extra_compile_args,
    extra_link_args=["-fsanitize=address,undefined"] if fuzz else [],
)

setup(ext_modules=cythonize([ext], compiler_directives=directives, quiet=True))
