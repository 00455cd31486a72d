#!/usr/bin/env bash
# Build kstore's core with Cython bounds checks and ASan/UBSan, then run the Hypothesis fuzz
# tests (and optionally the atheris entry point) under the sanitizers. Not part of CI.
#
#   bash fuzz/build_sanitized.sh                 # build in .fuzz-venv, run tests/reliability/test_fuzz.py
#   KSTORE_FUZZ_EXAMPLES=100000 bash fuzz/build_sanitized.sh
#   ATHERIS=1 bash fuzz/build_sanitized.sh       # also: atheris from source + a libFuzzer run
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m venv .fuzz-venv
. .fuzz-venv/bin/activate
pip install --quiet --upgrade pip
pip install --quiet --upgrade "setuptools>=77" cython numpy crcmod pytest hypothesis cramjam xxhash
# setup.py: Cython boundscheck/wraparound/initializedcheck/overflowcheck, -O1 -g, ASan + UBSan
export KSTORE_FUZZ_BUILD=1
if [ "${ATHERIS:-0}" = 1 ]; then
  command -v clang >/dev/null || { echo "ATHERIS=1 needs clang (apt-get install clang)"; exit 2; }
  export CC=clang CFLAGS="-fsanitize=fuzzer-no-link"
  pip install --quiet --no-binary atheris atheris       # built from source: sees the core's coverage
fi
rm -rf build kstore/_*.c kstore/_*.so
python setup.py -q build_ext --inplace
ASAN_LIB=$(${CC:-gcc} -print-file-name=libasan.so)
export PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
if [ "${ATHERIS:-0}" = 1 ]; then
  ASAN_LIB=$(python -c "import atheris, os; print(os.path.join(os.path.dirname(atheris.__file__), 'asan_with_fuzzer.so'))")
fi
LD_PRELOAD="$ASAN_LIB" python -X faulthandler -m pytest -q -p no:cacheprovider --import-mode=prepend tests/reliability/test_fuzz.py
if [ "${ATHERIS:-0}" = 1 ]; then
  LD_PRELOAD="$ASAN_LIB" python -X faulthandler fuzz/fuzz_decode.py -max_len=4096 -runs="${RUNS:-1000000}"
fi
# leave no sanitized build behind for the normal venv
rm -rf build kstore/_*.c kstore/_*.so
echo "sanitized fuzz run finished; rebuild normally with: python setup.py build_ext --inplace"
