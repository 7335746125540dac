#!/usr/bin/env bash
# The GPU check of issue 36 (see "GPU check" in the README and benchmarks/gpu_check.py):
# on a machine with one NVIDIA GPU, measure the zoo's and the derived models' compute
# profiles there, compare them with the derived profiles of that GPU, run
# `thrifty validate --device cuda` at world size 1 and the largest-batch search, in
# under 8 minutes, with the machine's own Python and torch plus the wheels in .whl/.
#
#   bash benchmarks/gpu_check.sh                     # on the GPU machine; writes to $OUT or ./gpu-check-out
#   bash benchmarks/gpu_check.sh --device cpu --quick  # the same steps on CPU, tiny settings (a dry run)
#
# PYTHON names the interpreter (default python3). The exit status is 0 when every
# required step passed.
set -u
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
