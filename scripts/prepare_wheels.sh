#!/usr/bin/env bash
# Fill .whl/ with CPython 3.12 manylinux (or pure-Python) wheels of every package kernelforge needs
# that the GPU image lacks (optuna, sqlalchemy, alembic, openai and their own needs), one version
# each, pinned to the versions installed in the Python that runs this (the checkout's .venv when it
# exists). scripts/gpu_check.sh installs them on the GPU machine, which has no network.
#   bash scripts/prepare_wheels.sh [--dest DIR]      (PYTHON=... picks another interpreter)
# Exits non-zero, naming the package, when a wheel cannot be found. docs/gpu.md explains the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" scripts/wheels.py "$@"
