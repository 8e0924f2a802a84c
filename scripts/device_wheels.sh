#!/usr/bin/env bash
# Download, here, the wheels the lent GPU machine lacks (it has no network), into .whl/,
# for its Python 3.12 on x86-64: the mpich wheel (libmpi and hydra's mpiexec, for the
# image's mpi4py) and pytest-mpi.  scripts/device_check.sh installs them there first;
# the device tool carries the folder when its call names it (carry: [".whl"]).
#   scripts/device_wheels.sh && du -sh .whl
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
mkdir -p .whl
for spec in "mpich==5.0.2" "pytest-mpi==0.6"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform any -d .whl "$spec"
done
ls -l .whl
