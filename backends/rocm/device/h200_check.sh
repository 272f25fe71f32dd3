#!/usr/bin/env bash
# One command on a machine with an NVIDIA H200 (run from the repository root):
#   bash backends/rocm/device/h200_check.sh
# Runs the conformance suite with the rocm backend's Triton kernels on the GPU (PAGED_ROCM_ALLOW_CUDA=1)
# and times decode (batch 64/256, context 1k/8k, head 128, GQA 8, bf16). Results go to $OUT (default ./reports).
#
# Assumption: the CPU torch that `bash ci/setup` installs cannot drive a GPU, so this needs a CUDA build of
# torch 2.13.0. It uses $PAGED_CUDA_VENV (default .venv-cuda) if that already has one; otherwise it tries to
# build it with pip, which needs network access. The lent device machine reaches nothing outside, so there
# it fails fast (within ~30 s) with a clear message unless the environment was prepared beforehand.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-reports}"
mkdir -p "$OUT"
VENV="${PAGED_CUDA_VENV:-.venv-cuda}"
has_cuda_torch() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys, torch, triton; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)' 2>/dev/null; }
if ! has_cuda_torch; then
  echo "h200_check: no CUDA torch in $VENV; trying to install torch==2.13.0 (CUDA) + triton (needs network)" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 15 --retries 1)
  if ! "${PIP[@]}" "torch==2.13.0" triton "setuptools>=68" wheel pytest tomli 2>"$OUT/pip-error.txt"; then
    echo "h200_check: FAILED: cannot install a CUDA build of torch (no network?). Prepare $VENV with" \
         "torch==2.13.0 (CUDA) and triton, or set PAGED_CUDA_VENV, then rerun. pip said:" >&2
    tail -3 "$OUT/pip-error.txt" >&2
    exit 3
  fi
  "${PIP[@]}" --no-build-isolation -e core -e plugins/conformance -e backends/triton -e backends/rocm
  has_cuda_torch || { echo "h200_check: FAILED: torch installed but sees no CUDA GPU" >&2; exit 3; }
fi
PY="$VENV/bin/python"
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)' | tee "$OUT/device.txt"
export PAGED_ROCM_ALLOW_CUDA=1
unset TRITON_INTERPRET PAGED_ROCM_INTERPRET
status=0
timeout 300 "$VENV/bin/paged-conformance" run --backend rocm --device cuda --grid "${ROCM_GRID:-quick}" \
  --json "$OUT/conformance-rocm-h200.json" --junitxml "$OUT/conformance-rocm-h200.xml" \
  > "$OUT/conformance-rocm-h200.txt" 2>&1 || status=$?
tail -40 "$OUT/conformance-rocm-h200.txt"
timeout 180 "$PY" -m paged_backend_rocm.bench --out "$OUT/decode-bench-h200.json" | tee "$OUT/decode-bench-h200.txt" || status=$?
exit "$status"
