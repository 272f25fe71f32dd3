#!/usr/bin/env bash
# Every GPU check of paged-backend-cuda in one run, on a machine with an NVIDIA GPU and no network (the lent
# H200: python3 with torch 2.11+cu130, transformers, pluggy, pytest; nvcc 13). From the repository root:
#   OUT=reports bash backends/cuda/device/h200_check.sh
# 1. builds the kernels for this GPU's architecture (seconds on 16 cores);
# 2. paged-conformance, full grid, on the GPU for each tier that can run: cuda (own kernels), cuda-flashinfer
#    (when flashinfer imports, or wheels are in $PAGED_FLASHINFER_WHEELS), cuda-flash-attn (when flash_attn imports);
# 3. the engine end to end in eager and CUDA-graph mode, greedy output token for token against transformers, the
#    backend's graph strategy replaying (replays per captured size); the synchronous and asynchronous scheduling loops
#    (same tokens under chunked prefill and preemption, decode tok/s of each);
#    step "pieces" (not in the default list: run it alone, it writes engine-device-cuda.json too): piecewise capture,
#    parity with mixed steps as pieces and inter-token latency with and without them; step "lora" (also run alone):
#    multi-LoRA greedy parity against transformers + PEFT with the cuda backend and with the Triton kernels;
# 4. decode timings (batch 64/256, context 1k/8k) as a share of the copy bandwidth, and against FlashInfer.
# H200_STEPS picks steps for a short run (default "conformance engine decode"); PAGED_DEVICE_WHEELS names a folder of
# wheels installed (offline) for the Python packages the image lacks (msgspec, pyzmq, gguf...).
# $OUT gets at most six files (the device tool returns eight): summary.txt (every step's output),
# conformance-<tier>.json per tier run, engine-device-cuda.json, decode-bench.json. Exit 1 if any check failed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-reports}"
mkdir -p "$OUT"
LOG="$OUT/summary.txt"
: > "$LOG"
PY="${PAGED_DEVICE_PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
say() { echo "== $*" | tee -a "$LOG"; }
"$PY" -c 'import torch; assert torch.cuda.is_available(); print("device:", torch.cuda.get_device_name(), "sm", torch.cuda.get_device_capability(), "torch", torch.__version__)' \
  2>&1 | tee -a "$LOG" || { say "no CUDA GPU visible to $PY"; exit 3; }
if [ -n "${PAGED_DEVICE_WHEELS:-}" ]; then
  for mod in msgspec zmq gguf rich psutil pluggy tqdm accelerate peft; do
    "$PY" -c "import $mod" 2>/dev/null && continue
    pkg=$mod; [ "$mod" = zmq ] && pkg=pyzmq
    "$PY" -m pip install --quiet --no-index --find-links "$PAGED_DEVICE_WHEELS" "$pkg" >> "$LOG" 2>&1 \
      && say "installed $pkg from $PAGED_DEVICE_WHEELS" || say "$pkg: not installed"
  done
fi
"$PY" -m pip install --quiet --no-deps --no-index --no-build-isolation -e core -e plugins/conformance -e backends/cuda -e backends/triton -e backends/rocm \
  >> "$LOG" 2>&1 || { say "install failed"; exit 3; }
STEPS=" ${H200_STEPS:-conformance engine decode} "
step() { [[ "$STEPS" == *" $1 "* ]]; }
if [ -n "${PAGED_FLASHINFER_WHEELS:-}" ]; then
  "$PY" -m pip install --quiet --no-deps --no-index "$PAGED_FLASHINFER_WHEELS"/*.whl >> "$LOG" 2>&1 || say "flashinfer wheels did not install"
fi
status=0
ARCH="$("$PY" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}" + ("a" if m == 9 else ""))')"
export PAGED_CUDA_CACHE="$PWD/.paged-cuda-cache"
say "build for sm_$ARCH"
( time "$PY" -m paged_backend_cuda.build --arch "$ARCH" --ptx '' --out "$PAGED_CUDA_CACHE/libpaged_cuda.so" ) >> "$LOG" 2>&1 \
  || { say "build failed"; tail -30 "$LOG"; exit 1; }
export PAGED_CUDA_LIBRARY="$PAGED_CUDA_CACHE/libpaged_cuda.so"
say "backends"
"$PY" -c "import sys; from paged_core.cli.main import main; sys.exit(main())" backends >> "$LOG" 2>&1 || true
for tier in cuda cuda-flashinfer cuda-flash-attn; do
  step conformance || break
  "$PY" - "$tier" >> "$LOG" 2>&1 <<'PYEOF' || continue
import sys
from paged_core.testing import load_registry
rec = [r for r in load_registry().records() if r.name == sys.argv[1]]
ok = bool(rec) and rec[0].status.value == "loaded"
print(f"{sys.argv[1]}: " + ("available" if ok else f"not run ({rec[0].reason if rec else 'not registered'})"))
sys.exit(0 if ok else 1)
PYEOF
  say "conformance $tier (grid ${CUDA_GRID:-full})"
  timeout 240 "$PY" -m paged_conformance.cli run --backend "$tier" --device cuda --grid "${CUDA_GRID:-full}" \
    --json "$OUT/conformance-$tier.json" > /tmp/conformance-$tier.txt 2>&1 || status=1
  tail -60 /tmp/conformance-$tier.txt >> "$LOG"
done
if step engine; then
  say "engine end to end (eager and CUDA graphs) vs transformers; scheduling loops"
  timeout 360 "$PY" ci/device_engine_check.py --backend cuda --async --out "$OUT" >> "$LOG" 2>&1 || status=1
fi
if step pieces; then
  say "piecewise capture: parity with mixed steps as pieces; ITL with and without pieces"
  timeout 420 "$PY" ci/device_engine_check.py --backend cuda --only-pieces --out "$OUT" >> "$LOG" 2>&1 || status=1
fi
if step lora; then
  say "multi-LoRA: a batch of base and three PEFT adapters against transformers + PEFT on the GPU"
  for backend in cuda rocm; do  # rocm: the shared Triton kernels (paged_triton) on this GPU
    timeout 200 "$PY" ci/device_engine_check.py --backend "$backend" --only-lora --out "$OUT" >> "$LOG" 2>&1 || status=1
  done
fi
if step decode; then
  say "decode bandwidth"
  timeout 150 "$PY" -m paged_backend_cuda.bench --out "$OUT/decode-bench.json" >> "$LOG" 2>&1 || status=1
fi
say "h200_check: $([ $status = 0 ] && echo PASS || echo FAIL)"
cat "$LOG" | grep -E "^== |passed|failed|PASS|FAIL|GB/s|copy|x FlashInfer|identical|async|Error" | tail -60
exit $status
