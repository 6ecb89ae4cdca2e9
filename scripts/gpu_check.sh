#!/usr/bin/env bash
# The mission proof on one Hopper GPU: scripts/gpu_check.py (its docstring; docs/gpu.md), with the
# image's python3 (or $PYTHON). --dry: the same steps in the interpreter; --plan: the budgets only.
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
