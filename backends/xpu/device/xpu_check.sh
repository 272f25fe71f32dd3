#!/usr/bin/env bash
# Every Intel GPU check of paged-backend-xpu in one run, for a machine with an Intel GPU (none was available to
# this project, so this script has never run). Needs python3 with PyTorch's XPU build (it brings
# pytorch-triton-xpu), transformers, pluggy and pytest; vllm-xpu-kernels optional. From the repository root:
#   OUT=reports bash backends/xpu/device/xpu_check.sh
# 1. paged-conformance, full grid, on the GPU for each tier that is available: xpu (the shared Triton kernels with
#    Intel tiles, XPU graphs), xpu-vllm-kernels (when vllm_xpu_kernels imports);
# 2. the engine end to end in eager and XPU-graph mode, greedy output token for token against transformers, and
#    decode tok/s with replay counts (ci/device_engine_check.py --backend xpu --device xpu).
# $OUT gets summary.txt, conformance-<tier>.json per tier run and engine-device-xpu.json. Exit 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-reports}"
mkdir -p "$OUT"
LOG="$OUT/summary.txt"
: > "$LOG"
PY="${PAGED_DEVICE_PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
unset TRITON_INTERPRET PAGED_XPU_INTERPRET PAGED_TRITON_INTERPRET_TILES
say() { echo "== $*" | tee -a "$LOG"; }
"$PY" -c 'import torch; assert torch.xpu.is_available(); print("device:", torch.xpu.get_device_name(), "torch", torch.__version__)' \
  2>&1 | tee -a "$LOG" || { say "no Intel GPU visible to $PY (torch.xpu)"; exit 3; }
"$PY" -m pip install --quiet --no-deps --no-build-isolation -e core -e plugins/conformance -e backends/triton \
  -e backends/xpu >> "$LOG" 2>&1 || { say "install failed"; exit 3; }
status=0
for tier in xpu xpu-vllm-kernels; do
  if ! "$PY" -c "import sys; from paged_core.registry import load_registry; r = {x.name: x for x in load_registry().records()}; sys.exit(0 if '$tier' in r and r['$tier'].selectable else 1)" 2>>"$LOG"; then
    say "$tier: not available here (see: paged backends)"
    continue
  fi
  say "conformance $tier (full grid, device xpu)"
  timeout 1800 "$PY" -m paged_conformance.cli run --backend "$tier" --device xpu --grid full \
    --json "$OUT/conformance-$tier.json" >> "$LOG" 2>&1 || { status=1; say "conformance $tier FAILED"; }
  tail -20 "$LOG" | grep -E "passed|failed" | tail -1
done
say "engine end to end (eager and XPU graphs; greedy vs transformers)"
timeout 1200 "$PY" ci/device_engine_check.py --backend xpu --device xpu --out "$OUT" >> "$LOG" 2>&1 \
  || { status=1; say "engine check FAILED"; }
tail -3 "$LOG"
exit "$status"
