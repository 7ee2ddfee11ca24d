#!/usr/bin/env bash
# The GPU check (see scripts/gpu_check.py for every step): from the repository root,
#
#   bash scripts/gpu_check.sh OUT_DIR                 # on a machine with CUDA GPUs, < 5 minutes
#   bash scripts/gpu_check.sh OUT_DIR --cpu-dry-run   # every step on the CPU, to try the script
#
# OUT_DIR must be new or empty; it receives the runs, gpu_check.log and gpu_check.json (the
# environment and each step's PASS/FAIL/SKIP and timing). PYTHON=... picks the interpreter.
set -u
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
