#!/usr/bin/env bash
# Thread scaling on a many-core machine, in one unattended run (for a machine held for
# minutes): installs relufast from this checkout into a folder, then runs the thread-scaling
# benchmark ((784, 128, 128) cases at 2 threads and at all cores; the default cases at 1, 2,
# 4, ... all cores), the moment kernel against dgemm, one chosen-query extraction of a
# planted 784-64-64-10 (bench/chosen_once.py), a profile of the largest case and the
# kernels' tests on every core; first the test suite (on every core with pytest-xdist).
# Every step has a time limit; logs and pytest-benchmark JSON go to $OUT (default
# ./many_core_out), each file written directly (a step killed at its limit keeps its log).
#
# SKIP="moments chosen tests" leaves those steps out (suite_default, suite_<coretype>,
# suite_baseline, threads_large, threads, moments, chosen, profile, tests); CORETYPES="SkylakeX
# Haswell" runs the suite under those OpenBLAS kernels (SUITE_LIMIT seconds each, default
# 240), BASELINE_CORETYPE=Zen the baseline build's run under another (default: the first);
# LARGE_THREADS=2,8,16 sets the large cases' thread counts (default 2 and every core),
# SMALL_THREADS those of the default cases.
#
# Offline: WHEELS=folder holding highspy, cmeel and cmeel-eigen wheels for this Python
# (pip download --no-deps --only-binary=:all: ...); the machine must already have numpy,
# scipy, pybind11, scikit-build-core, cmake, ninja, threadpoolctl, pytest and
# pytest-benchmark. Usage: OUT=results WHEELS=wheels bash bench/many_core.sh
set -u
OUT=${OUT:-./many_core_out}
PY=${PYTHON:-python3}
WORK=${WORK:-$(mktemp -d)}
NCORES=$($PY -c "import os; print(len(os.sched_getaffinity(0)))")
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
step() {  # step NAME SECONDS COMMAND...: run with a time limit, output to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    log "skip $name"
    return 0
  fi
  log "start $name (limit ${limit} s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  log "end $name rc=$rc in $((SECONDS - t0)) s"
  tail -n 12 "$OUT/$name.txt"
  return $rc
}

step facts 60 bash -c "nproc; free -g | head -2; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|NUMA node\(|L3|Flags' | cut -c1-200; \
  $PY --version; $PY -m pip list 2>/dev/null | grep -i -E 'numpy|scipy|threadpoolctl|pybind11|scikit-build|cmake|ninja|pytest|highspy|cmeel'; \
  $PY -c 'import numpy, threadpoolctl; print(threadpoolctl.threadpool_info())'"

if [ -n "${WHEELS:-}" ]; then
  step wheels 120 $PY -m pip install -q --no-index --no-deps --find-links "$WHEELS" --target "$WORK/site" highspy cmeel cmeel-eigen
  export PYTHONPATH="$WORK/site"
fi
step build 300 env CMAKE_BUILD_PARALLEL_LEVEL="$NCORES" $PY -m pip install --no-build-isolation --no-deps --target "$WORK/rf" . ||
  { log "build failed"; exit 1; }
export PYTHONPATH="$WORK/rf${PYTHONPATH:+:$PYTHONPATH}"
step import 60 $PY -c "import relufast, relufast._native as n; print(relufast.__version__, relufast.BACKEND, n.core.__file__, n.core.hardware_threads())"

# The test suite on every core (pytest-xdist where the machine has it), once under each
# OpenBLAS core type of CORETYPES (default: the one OpenBLAS picks; SkylakeX only runs on
# CPUs with AVX-512), then once more with relufast's baseline (portable) build.
SUITE=(-p no:cacheprovider -p no:benchmark -o "addopts=-m 'not slow'" -q -rfE)
if $PY -c "import xdist" 2>/dev/null; then SUITE+=(-n "${SUITE_WORKERS:-$NCORES}"); fi
if $PY -c "import pytest_timeout" 2>/dev/null; then SUITE+=(--timeout=150); fi  # a hang fails its test
for ct in ${CORETYPES:-default}; do
  if [ "$ct" = default ]; then
    step suite_default "${SUITE_LIMIT:-240}" $PY -m pytest "${SUITE[@]}" tests
  else
    step "suite_$ct" "${SUITE_LIMIT:-240}" env OPENBLAS_CORETYPE="$ct" $PY -m pytest "${SUITE[@]}" tests
  fi
done
CORETYPES=${CORETYPES:-default}
BASE_CT=${BASELINE_CORETYPE:-${CORETYPES%% *}}
[ "$BASE_CT" = default ] && BASE_CT=
step suite_baseline "${SUITE_LIMIT:-240}" env RELUFAST_BACKEND=baseline ${BASE_CT:+OPENBLAS_CORETYPE=$BASE_CT} \
  $PY -m pytest "${SUITE[@]}" tests

BENCH=(-p no:cacheprovider -o addopts= --benchmark-only -s -q)
# The figures first (the large cases at 2 threads and every core), then the rest.
step threads_large 240 $PY -m pytest bench/test_bench_threads.py "${BENCH[@]}" --threads-large -k "784" \
  --threads-list "${LARGE_THREADS:-2,$NCORES}" --benchmark-json="$OUT/threads_large.json"
step threads 180 $PY -m pytest bench/test_bench_threads.py "${BENCH[@]}" ${SMALL_THREADS:+--threads-list "$SMALL_THREADS"} \
  --benchmark-json="$OUT/threads.json"
step moments 90 $PY -m pytest bench/test_bench_moments.py -k "test_relufast_moment" "${BENCH[@]}" \
  --benchmark-json="$OUT/moments.json"
step chosen 90 $PY bench/chosen_once.py 784 64,64 10
step profile 90 $PY bench/profile_recovery.py 784 128 128 200000 --threads "$NCORES" --top 30
step tests 120 $PY -m pytest -p no:cacheprovider -o addopts= -q -x tests/test_cp_kernels.py tests/test_tensor.py \
  tests/test_kernel_faults.py tests/test_kernels_property.py tests/test_units.py
log "done"
