#!/usr/bin/env bash
# All GPU checks in one command, under 8 minutes on one H200:
#   1. the GPU-marked tests (baselines verify on the GPU, timer vs wall time, AOT == JIT registers;
#      adversarial: side streams, roofline flags, CUDA errors retiring the worker),
#   2. `kernelforge check` of every block on its held-out check shapes and on real presets,
#   3. ahead-of-time resources for the local GPU, and a summary table printed last.
# Runs from a plain checkout (no install): the GPU image has torch, triton, jinja2, click and rich;
# pytest comes from .whl/ when the image lacks it. Results go to $OUT (device tool) or reports/.
set -uo pipefail
cd "$(dirname "$0")/.."
STAMP=$(date -u +%Y%m%d)
DEST="${OUT:-reports/gpu-check-$STAMP}"
mkdir -p "$DEST"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 KERNELFORGE_TEST_DEVICE=cuda
if ! $PY -c "import pytest" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --target /tmp/kf-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/kf-site"
fi
status=0
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  $PY -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$DEST/device.txt"

if $PY -c "import pytest" 2>/dev/null; then
    timeout 270 $PY -m pytest tests/devices/test_gpu.py tests/execute/test_gpu_adversarial.py -q -p no:cacheprovider 2>&1 | tee "$DEST/gpu_tests.log" || status=1
else
    echo "pytest is not installed and no .whl/ was carried: GPU tests skipped" | tee "$DEST/gpu_tests.log"
fi

kf() { local limit=$1; shift; timeout "$limit" $PY -m kernelforge "$@" 2>&1 | tee -a "$DEST/check.log"; return "${PIPESTATUS[0]}"; }
for dtype in bfloat16 float16; do
    kf 150 check --device cuda --shapes check --dtype $dtype --json "$DEST/check_$dtype.json" || status=1
done
kf 120 check attention/gpt_oss_prefill --device cuda --shapes interactive --json "$DEST/prefill_interactive.json" || status=1
kf 120 check attention/gpt_oss_decode --device cuda --shapes interactive --json "$DEST/decode_interactive.json" || status=1
kf 120 check moe/gpt_oss_experts --device cuda --shapes gpt-oss-120b --json "$DEST/moe_120b.json" || status=1
for t in attention/gpt_oss_prefill attention/gpt_oss_decode moe/gpt_oss_experts; do
    kf 60 compile "$t" || status=1
done
$PY scripts/gpu_summary.py "$DEST" | tee "$DEST/summary.txt" || status=1
exit $status
