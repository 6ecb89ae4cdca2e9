#!/usr/bin/env bash
# The mission proof on one H200, self-contained on the GPU image (docs/gpu.md), in under 9 minutes:
#   env       the device, driver and versions
#   wheels    .whl/ (scripts/prepare_wheels.sh, run beforehand where pip works) installed into a
#             target folder put on PYTHONPATH: the image has no optuna, sqlalchemy or alembic
#   imports   everything a search needs imports
#   tests     the GPU-marked tests (pytest -m gpu)
#   check-*   baseline verification and timing at each real preset of the proof jobs
#   search-*  a short real search per block at those presets, ending in confirmation pairs
#   report-*  the HTML report (percent of roofline, energy per call) of each job
#   summary   one table of all of it (scripts/gpu_summary.py), then the time of every step
# Every step runs under its own `timeout`; the budgets add up to at most 540 s, and the total is
# printed. Results go to reports/h200-<date>/ and, when OUT is set (the device tool), to $OUT.
#
# --dry (or KF_GPU_CHECK_DRY=1; `make gpu-check-dry`): the same steps in Triton's CPU interpreter on
# tiny smoke shapes (search/gpu-dry*.toml) into reports/interpret-dry/. Only what needs a GPU is
# skipped (the GPU tests are only collected; the wheels install for Python 3.12 without importing
# them unless this is 3.12). Its times are interpreter wall time on the CPU, never GPU speed.
# KF_GPU_CHECK_DEST overrides the output folder; PYTHON the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
if [ "${1:-}" = "--dry" ] || [ "${KF_GPU_CHECK_DRY:-0}" = 1 ]; then MODE=dry; fi
PY=${PYTHON:-python3}
STAMP=$(date -u +%Y%m%d)
declare -A B_SEARCH_OF=() B_CHECK_OF=()
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$MODE" = dry ]; then
    DEST=${KF_GPU_CHECK_DEST:-reports/interpret-dry}
    JOBS=(search/gpu-dry.toml search/gpu-dry-moe.toml)
    DEVICE=interpret
    # Interpreter budgets: generous, since CI machines are shared (about 3 minutes on 2 idle cores).
    B_ENV=60 B_WHEELS=90 B_IMPORTS=60 B_TESTS=120 B_CHECK=150 B_SEARCH=300 B_REPORT=90 B_SUMMARY=30
else
    DEST=${KF_GPU_CHECK_DEST:-reports/h200-$STAMP}
    JOBS=(search/h200-proof.toml search/h200-proof-moe-t1.toml search/h200-proof-moe-t64.toml
          search/h200-proof-moe-t4096.toml)
    DEVICE=cuda
    export KERNELFORGE_TEST_DEVICE=cuda
    # Seconds per step; over the whole run they add up to 534, under 9 minutes. A search's own
    # max_minutes (its job file: 1.5 and 0.5) ends it gracefully, confirmation included, before
    # its step's budget, which adds the start-up of the process and its worker.
    B_ENV=10 B_WHEELS=30 B_IMPORTS=20 B_TESTS=75 B_CHECK=25 B_SEARCH=42 B_REPORT=8 B_SUMMARY=10
    B_SEARCH_OF=([h200-proof]=100)
    B_CHECK_OF=([gpt-oss/8k1k/full]=28 [gpt-oss-120b/T4096]=28)
fi
mkdir -p "$DEST"
rm -rf "$DEST/logs" "$DEST/check" "$DEST/db" "$DEST/steps.tsv" "$DEST/summary.txt"
mkdir -p "$DEST/logs" "$DEST/check" "$DEST/db"
STEPS="$DEST/steps.tsv"
printf 'step\tbudget_s\tseconds\tstatus\n' >"$STEPS"
FAILED=0
START=$(date +%s%N)

# step NAME BUDGET CMD...: run CMD under `timeout BUDGET`, log to logs/NAME.log, record the time.
step() {
    local name=$1 budget=$2 t0 rc secs status
    shift 2
    echo "== [$name] (budget ${budget}s): $*"
    t0=$(date +%s%N)
    timeout --kill-after=5 "$budget" "$@" 2>&1 | tee "$DEST/logs/$name.log"
    rc=${PIPESTATUS[0]}
    secs=$(( ($(date +%s%N) - t0) / 1000000 ))
    case $rc in
        0) status=ok ;;
        124|137) status="timed out after ${budget}s"; FAILED=1 ;;
        *) status="failed (exit $rc)"; FAILED=1 ;;
    esac
    printf '%s\t%s\t%d.%03d\t%s\n' "$name" "$budget" $((secs / 1000)) $((secs % 1000)) "$status" >>"$STEPS"
    echo "== [$name] $status in $((secs / 1000)).$(printf %03d $((secs % 1000))) s"
    return "$rc"
}
skip() {  # skip NAME REASON: record a step that this mode does not run
    printf '%s\t0\t0.000\tskipped: %s\n' "$1" "$2" >>"$STEPS"
    echo "== [$1] skipped: $2"
}

# -- env ---------------------------------------------------------------------------------------
if [ "$MODE" = dry ]; then
    step env "$B_ENV" "$PY" -c "import sys, torch, triton; print('DRY RUN in the Triton interpreter on the CPU: every time is interpreter wall time, not GPU speed'); print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
else
    step env "$B_ENV" bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv && $PY -c \"import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'gpu', torch.cuda.get_device_name())\""
fi
cp "$DEST/logs/env.log" "$DEST/device.txt"

# -- wheels ------------------------------------------------------------------------------------
SITE=$(mktemp -d "${TMPDIR:-/tmp}/kf-site.XXXXXX")
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if ! ls .whl/*.whl >/dev/null 2>&1; then
    if [ "$MODE" = dry ]; then
        skip wheels "no .whl/ (scripts/prepare_wheels.sh fills it): using this interpreter's packages"
    else
        skip wheels "no .whl/ was carried: run scripts/prepare_wheels.sh here and carry .whl"
    fi
elif [ "$PYVER" = 3.12 ]; then
    step wheels "$B_WHEELS" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl && export PYTHONPATH="$PYTHONPATH:$SITE"
else
    # The wheels are for the GPU image's 3.12: install them for 3.12 (proves the set is complete and
    # has one version of each) but do not import them into this Python $PYVER.
    step wheels "$B_WHEELS" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" --python-version 3.12 --implementation cp --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 .whl/*.whl
fi
if ! step imports "$B_IMPORTS" "$PY" -c "import optuna, sqlalchemy, jinja2, click, rich, torch, triton, kernelforge.cli.main; print('optuna', optuna.__version__, 'sqlalchemy', sqlalchemy.__version__)"; then
    echo "imports failed: a search needs optuna and sqlalchemy; on the GPU image run scripts/prepare_wheels.sh beforehand where pip works and carry .whl (docs/gpu.md)"
fi

# -- GPU tests ---------------------------------------------------------------------------------
# The files that hold GPU-marked tests (found by grep: collecting the whole suite is slow).
mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
if [ "$MODE" = dry ]; then
    # Needs a GPU: only collected here, so a broken GPU test file still fails the dry run.
    step tests "$B_TESTS" "$PY" -m pytest -q -p no:cacheprovider -m gpu --collect-only "${GPU_TESTS[@]}"
else
    step tests "$B_TESTS" "$PY" -m pytest -q -p no:cacheprovider -m gpu "${GPU_TESTS[@]}"
fi

# -- baseline check at the proof's presets -------------------------------------------------------
mapfile -t PLAN < <("$PY" scripts/proof_plan.py "${JOBS[@]}")
i=0
for row in "${PLAN[@]}"; do
    IFS=$'\t' read -r job block shapes <<<"$row"
    i=$((i + 1))
    budget=${B_CHECK_OF[$shapes]:-$B_CHECK}
    step "check-$i" "$budget" "$PY" -m kernelforge check "$block" --device "$DEVICE" --shapes "$shapes" \
        --json "$DEST/check/$i.json"
done

# -- search, confirmation pairs and report per job -----------------------------------------------
for file in "${JOBS[@]}"; do
    name=$("$PY" scripts/proof_plan.py "$file" | head -1 | cut -f1)
    budget=${B_SEARCH_OF[$name]:-$B_SEARCH}
    if [ "$(realpath -m "reports/$name")" = "$(realpath -m "$DEST")" ]; then
        echo "job $name would write its report over this run's folder $DEST: rename one" >&2; exit 2
    fi
    storage="sqlite:///$(realpath -m "$DEST/db/$name.db")"
    step "search-$name" "$budget" "$PY" -m kernelforge search "$file" --device "$DEVICE" --storage "$storage" \
        --progress jsonl --no-report
    # The report is written to reports/<job>/ and moved into this run's folder.
    rm -rf "reports/$name" "$DEST/$name"
    step "report-$name" "$B_REPORT" "$PY" -m kernelforge report "$file" --storage "$storage" \
        && mv "reports/$name" "$DEST/$name"
done

# -- summary -----------------------------------------------------------------------------------
step summary "$B_SUMMARY" "$PY" scripts/gpu_summary.py "$DEST" --mode "$MODE"
cp "$DEST/logs/summary.log" "$DEST/summary.txt"
TOTAL=$(( ($(date +%s%N) - START) / 1000000 ))
BUDGET=$(awk -F'\t' 'NR > 1 { s += $2 } END { print s }' "$STEPS")
{
    echo
    column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"
    printf 'total %d.%03d s (step budgets %d s)%s\n' $((TOTAL / 1000)) $((TOTAL % 1000)) "$BUDGET" \
        "$([ "$MODE" = dry ] && echo '; DRY RUN: interpreter wall time on the CPU, not GPU speed')"
    [ "$FAILED" = 0 ] && echo "every step passed" || echo "SOME STEPS FAILED (see $DEST/logs/)"
} | tee -a "$DEST/summary.txt"

# -- $OUT (device tool: at most 8 files come back) ------------------------------------------------
if [ -n "${OUT:-}" ]; then
    cp "$DEST/summary.txt" "$DEST/steps.tsv" "$DEST/device.txt" "$OUT/"
    tar -czf "$OUT/$(basename "$DEST").tar.gz" -C "$(dirname "$DEST")" "$(basename "$DEST")"
    for file in "${JOBS[@]}"; do
        name=$("$PY" scripts/proof_plan.py "$file" | head -1 | cut -f1)
        [ -f "$DEST/$name/index.html" ] && cp "$DEST/$name/index.html" "$OUT/$name.html"
    done
fi
rm -rf "$SITE"
exit "$FAILED"
