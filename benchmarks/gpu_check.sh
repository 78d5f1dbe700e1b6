#!/usr/bin/env bash
# GPU check: the speed benchmarks on CUDA with bf16 autocast (--amp) and small repeat counts, plus the
# flash-attention check, in under 8 minutes. Results: benchmarks/results/gpu/*.json.
#
#   bash benchmarks/gpu_check.sh            # from anywhere; uses the repo's .venv, else `python` on PATH
#
# Exits non-zero with a message when no CUDA device is visible, and when any step fails or runs past
# its time limit (the remaining steps still run, so one slow benchmark does not hide the others).
#
# Time budget (480 s in all; every command runs under `timeout`, plus up to 5 s each to be killed):
#    20 s  CUDA visibility check (torch import)
#    40 s  flash SDPA check on the models' attention shapes      -> flash_check.json
#   150 s  so3vit_vs_s2transformer (5 models, forward + training memory, one process per model)
#    60 s  o2_speed (D4 coupled / irrep-wise vs timm, batch 1 and 16)
#   120 s  platonic_speed (points / images / sphere vs timm, batch 1 and 16, GroupConvLinear micro)
#    30 s  wigner_timing (960 poses, L = 7)
#   ----
#   420 s  + 6 x 5 s kill grace = 450 s worst case, leaving 30 s for nvidia-smi and process start-up.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="benchmarks/results/gpu"
export PYTHONUNBUFFERED=1

if [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
elif command -v python >/dev/null 2>&1; then
    PY=python
else
    echo "gpu_check: no .venv/bin/python and no python on PATH" >&2
    exit 2
fi

echo "== nvidia-smi -L"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
    echo "gpu_check: FAILED: no CUDA device visible (nvidia-smi missing or failing)" >&2
    exit 1
fi
if ! timeout --kill-after=5 20 "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: FAILED: torch sees no CUDA device ($PY; torch.cuda.is_available() is False)" >&2
    exit 1
fi

mkdir -p "$OUT"
failures=()
step() {  # step SECONDS NAME COMMAND...: run under timeout, record a failure instead of stopping
    local seconds="$1" name="$2"
    shift 2
    echo
    echo "== $name (limit ${seconds}s): $*"
    local start=$SECONDS rc=0
    timeout --kill-after=5 "$seconds" "$@" || rc=$?
    if [[ $rc -eq 0 ]]; then
        echo "== $name: ok in $((SECONDS - start))s"
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "== $name: TIMED OUT after ${seconds}s" >&2
        failures+=("$name (timed out after ${seconds}s)")
    else
        echo "== $name: FAILED with exit code $rc" >&2
        failures+=("$name (exit code $rc)")
    fi
}

step 40 flash_check "$PY" benchmarks/_device.py --device cuda --out "$OUT/flash_check.json"
step 150 so3vit_vs_s2transformer "$PY" benchmarks/so3vit_vs_s2transformer.py --device cuda --amp \
    --repeats 10 --s2-repeats 5 --warmup 2 --train-steps 2 --out "$OUT/so3vit_vs_s2transformer.json"
step 60 o2_speed "$PY" benchmarks/o2_speed.py --device cuda --amp \
    --batches 1 16 --threads 1 --repeats 10 --out "$OUT/o2_speed.json"
step 120 platonic_speed "$PY" benchmarks/platonic_speed.py --device cuda --amp \
    --repeats 5 --big-repeats 3 --micro-repeats 5 --out "$OUT/platonic_speed.json"
step 30 wigner_timing "$PY" benchmarks/wigner_timing.py --device cuda \
    --repeats 20 --warmup 3 --out "$OUT/wigner_timing.json"

echo
echo "gpu_check: wall time ${SECONDS}s; results in $OUT/"
if [[ ${#failures[@]} -gt 0 ]]; then
    printf 'gpu_check: FAILED: %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "gpu_check: all steps ok"
