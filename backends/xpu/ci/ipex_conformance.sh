#!/usr/bin/env bash
# The IPEX tier (`xpu-ipex`) through the full conformance grid on CPU tensors, in a venv of its own.
#
# IPEX 2.8.0 is the last release; it pins torch 2.8.0, which PyPI has only as a CUDA build
# (+cu128: ~6.7 GB installed with its nvidia-* wheels, a few minutes to install; it imports and
# runs fine without a GPU). So this job cannot share the main .venv (torch 2.13) and builds:
#   ${PAGED_IPEX_VENV:-.venv-ipex}   torch==2.8.0, intel-extension-for-pytorch==2.8.0, and
#                                    paged-core, paged-conformance, paged-triton, paged-backend-xpu (editable, --no-deps,
#                                    with the few runtime deps the suite imports listed below).
# The IPEX Python package is never imported (it dies on transformers 5); the backend loads only its
# op library (paged_backend_xpu.ipex_library). Reports: reports/conformance-xpu-ipex.{json,xml} and
# reports/ipex-envelope.xml (tests/test_ipex_envelope.py: the declared head sizes and GQA ratios the grid skips).
#
# Environment: PAGED_IPEX_VENV (venv folder), IPEX_GRID (full | quick; default full),
# IPEX_BACKEND (default xpu-ipex; `paged_backend_xpu.ipex_backend:IpexBackend` works without the plugin).
set -euo pipefail
cd "$(dirname "$0")/../../.."
VENV="${PAGED_IPEX_VENV:-.venv-ipex}"
GRID="${IPEX_GRID:-full}"
BACKEND="${IPEX_BACKEND:-xpu-ipex}"
STAMP="$VENV/.paged-ipex-ready"

if [ ! -f "$STAMP" ]; then
  start=$(date +%s)
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
  # torch pinned to what IPEX 2.8.0 was built against (its op library links torch 2.8's ABI).
  "${PIP[@]}" "torch==2.8.0" "intel-extension-for-pytorch==2.8.0" "setuptools>=77,<85" wheel
  # The workspace packages without dependency resolution (their ranges would be re-resolved against
  # torch 2.8); what they import at run time is listed here instead. paged-triton comes along because
  # paged_backend_xpu's package and plugin import its backend class (not triton itself, though torch
  # 2.8's wheel brings triton anyway); this tier never runs a Triton kernel.
  "${PIP[@]}" "numpy>=1.24,<3" "pluggy>=1.5" "psutil>=5.9" "tqdm>=4.66" "pytest>=8"
  "${PIP[@]}" --no-deps --no-build-isolation -e core -e plugins/conformance -e backends/triton -e backends/xpu
  touch "$STAMP"
  echo "ipex venv ready in $(( $(date +%s) - start )) s: $(du -sh "$VENV" | cut -f1)"
fi

mkdir -p reports
"$VENV/bin/python" -c 'import torch; from paged_backend_xpu import ipex_library as m; print("torch", torch.__version__, "|", m.describe())'
start=$(date +%s)
rc=0
"$VENV/bin/paged-conformance" run --backend "$BACKEND" --device cpu --grid "$GRID" \
  --json reports/conformance-xpu-ipex.json --junitxml reports/conformance-xpu-ipex.xml || rc=$?
echo "conformance ($GRID) finished in $(( $(date +%s) - start )) s, exit $rc"
# The declared head sizes and GQA ratios the grid does not sweep, on the same real ops.
"$VENV/bin/python" -m pytest -q backends/xpu/tests/test_ipex_envelope.py \
  --junitxml reports/ipex-envelope.xml || rc=$?
exit "$rc"
