#!/usr/bin/env bash
# The GPU checks, as one script for a machine lent with an NVIDIA GPU (issue 16), in
# under 8 minutes; every step has its own timeout and its log in $OUT (default
# ./device-logs).  Nothing is fetched: what the machine lacks travels as wheels in .whl/
# (scripts/device_wheels.sh makes them here) and is installed into /tmp/site first.
#
#   scripts/device_check.sh            on the GPU machine
#   scripts/device_check.sh --dry-run  anywhere: Numba's CUDA simulator, tiny sizes, no
#                                      targets, no wheels installed; it proves this
#                                      script's own logic (CI)
#
#   1. preflight: versions, nvidia-smi, CUDA-aware MPI; stops at once if a piece is missing
#   2. the real-GPU tests (tests/gpu) and the kernel tests on the device
#   3. kernel bandwidth: float32, float16, int8 at 64 MiB and 1 GiB, blocks 1-8 x SMs and
#      the default rule, against cupy.add (targets: 90% / 80% / 80%)
#   4. every collective on CuPy arrays at 2 and 4 ranks sharing the GPU, checked against
#      the host MPI library
#   5. a 64 MiB allreduce through staging against the naive path (target: 1.5x)
#   6. a CUDA IPC probe between two ranks (reported, not required)
# Exit status: 0 when every step passed, 1 when one failed (a wrong result, a missed
# target, a timeout), 2 when the preflight found something missing.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=""
[ "${1:-}" = "--dry-run" ] && dry="--dry-run"
OUT="${OUT:-$PWD/device-logs}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -n "$dry" ]; then
    export NUMBA_ENABLE_CUDASIM=1
else
    export HPCCOLL_TEST_REAL_GPU=1
fi
if [ -z "$dry" ] && compgen -G ".whl/*.whl" >/dev/null; then
    # --prefix, not --target: the mpich wheel's libmpi is a data file, which --target drops
    echo "== 0. installing the carried wheels (.whl/) under /tmp/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --prefix /tmp/site .whl/*.whl 2>&1 | tee "$OUT/0-wheels.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || exit 2
    site="$(echo /tmp/site/lib/python3*/site-packages)"
    export PYTHONPATH="$site:$PYTHONPATH" PATH="/tmp/site/bin:$PATH" \
        LD_LIBRARY_PATH="/tmp/site/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
PY="$(command -v python3 || command -v python)"
# the MPI's launcher with what it needs (hpccoll/launch.py; Open MPI: --oversubscribe)
read -r -a MPIEXEC <<< "$("$PY" -m hpccoll.launch)"
status=0
failed=()

# step NAME SECONDS COMMAND...: run it under its own timeout, its output also in $OUT/NAME.log
step() {
    local name="$1" limit="$2" rc
    shift 2
    echo "== $name (at most ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        status=1
        failed+=("$name (exit $rc$([ "$rc" -eq 124 ] && echo ': timed out'))")
    fi
    return "$rc"
}

if ! step 1-preflight 60 "$PY" scripts/device_preflight.py $dry; then
    echo "== device check: STOPPED, the preflight says what is missing ($OUT/1-preflight.log)"
    exit 2
fi
if [ -n "$dry" ]; then
    step 2-gpu-tests 120 "$PY" -m pytest -q -p no:cacheprovider tests/gpu
else
    step 2-gpu-tests 150 "$PY" -m pytest -q -p no:cacheprovider tests/gpu \
        tests/unit/test_kernels.py
fi
step 3-kernel-bench 110 "$PY" scripts/gpu_kernel_bench.py --sizes 64M,1G $dry
for n in 2 4; do
    MPIEXEC_TIMEOUT=80 step "4-collectives-${n}ranks" 90 "${MPIEXEC[@]}" -n "$n" "$PY" \
        scripts/gpu_collectives_check.py $dry
done
MPIEXEC_TIMEOUT=40 step 5-staging-bench 50 "${MPIEXEC[@]}" -n 2 "$PY" scripts/gpu_collectives_check.py \
    --staging-bench $dry
MPIEXEC_TIMEOUT=20 step 6-ipc-probe 30 "${MPIEXEC[@]}" -n 2 "$PY" scripts/gpu_collectives_check.py \
    --ipc-probe $dry
if [ "$status" -eq 0 ]; then
    echo "== device check: every step passed${dry:+ (dry run)}; logs in $OUT"
else
    echo "== device check: FAILED: ${failed[*]}; logs in $OUT"
fi
exit "$status"
