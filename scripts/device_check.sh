#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU (under 5 minutes, installs nothing from the
# network: it needs cupy, numba(-cuda), mpi4py and an MPI already installed).
#   1. the real-GPU tests (tests/gpu) and the kernel tests on the real device;
#   2. kernel bandwidth of sum-reduce of 2 float32 inputs at 64 MiB and 1 GiB for block
#      counts 1..8xSMs vs cupy.add and the device's peak memory bandwidth;
#   3. a 2- and a 4-rank allreduce of CuPy arrays on one GPU, results checked.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HPCCOLL_TEST_REAL_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || exit 1
status=0
echo "== 1. GPU tests"
timeout 120 python -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_kernels.py -k "cuda or gpu or cupy" || status=1
echo "== 2. kernel bandwidth"
timeout 90 python scripts/gpu_kernel_bench.py --sizes 64M,1G || status=1
echo "== 3. allreduce of CuPy arrays on one GPU"
for n in 2 4; do
    MPIEXEC_TIMEOUT=60 timeout 70 mpiexec -n "$n" python scripts/gpu_allreduce_check.py || status=1
done
exit $status
