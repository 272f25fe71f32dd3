#!/usr/bin/env bash
# The toolchain of the XPU ahead-of-time check (python -m paged_backend_xpu.aot), no Intel GPU needed.
# Idempotent: a second run only checks what is there.
#   (a) a virtual environment ${PAGED_XPU_AOT_VENV:-.venv-xpu-aot} with the CPU build of torch 2.13.0, PyPI's
#       triton-xpu 3.3.0b1 (Triton with Intel's backend: kernels -> SPIR-V) and the workspace's core,
#       backends/triton and backends/xpu installed editable without their dependencies (plus the
#       few that importing them needs);
#   (b) Intel's offline compiler ocloc (SPIR-V -> native pvc / dg2 code, with a register and spill report), from
#       Debian bookworm's intel-opencl-icd 22.43 and its libraries, unpacked (dpkg -x, nothing installed) into
#       ${PAGED_OCLOC_DIR:-$HOME/.cache/paged/ocloc}. Needs apt-get (any Debian/Ubuntu with bookworm's packages
#       in its sources); no root needed when the package lists are current.
# Measured here (2 cores, pip's cache warm, triton-xpu's wheel 182 MB): 65 s for both; (a) is 1.6 GB, (b) 70 MB.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VENV="${PAGED_XPU_AOT_VENV:-.venv-xpu-aot}"
OCLOC_DIR="${PAGED_OCLOC_DIR:-$HOME/.cache/paged/ocloc}"
PYTHON="${PYTHON:-python3.11}"  # triton-xpu 3.3.0b1 ships cp39-cp313 wheels; CI's python is 3.11
command -v "$PYTHON" >/dev/null || PYTHON=python3

# (a) the environment
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch pinned first (the local CPU wheel): a bare `torch` requirement would pull a multi-GB CUDA build.
"${PIP[@]}" "torch==2.13.0" "setuptools>=77,<85" wheel
# Pre-release only: --pre. Its module is `triton`, so it lives in this environment and nowhere else.
"${PIP[@]}" --pre "triton-xpu==3.3.0b1"
# The workspace, editable and without dependencies (they would ask for the PyPI `triton`), then what importing
# paged_core.api needs.
"${PIP[@]}" --no-deps --no-build-isolation -e core -e backends/triton -e backends/xpu
"${PIP[@]}" "numpy>=1.24" "pluggy>=1.5" "psutil>=5.9" "tqdm>=4.66"
if "$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -i -E '^(nvidia-|triton )'; then
  echo "error: $VENV has CUDA packages or PyPI's triton (listed above); remove $VENV and rerun" >&2
  exit 1
fi
env -u TRITON_INTERPRET "$VENV/bin/python" - <<'EOF'
import torch, triton
from triton.backends import backends
assert "intel" in backends, f"triton {triton.__version__} has no Intel backend: {sorted(backends)}"
import paged_core.api, paged_triton.specializations  # noqa: F401,E401
print(f"aot venv: torch {torch.__version__}, triton {triton.__version__} (backends {sorted(backends)})")
EOF

# (b) ocloc
if ! "$OCLOC_DIR/ocloc" --help >/dev/null 2>&1; then
  debs=(intel-opencl-icd libigc1 libigdfcl1 libigdgmm12 libopencl-clang14 libllvmspirvlib14 ocl-icd-libopencl1)
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && apt-get download "${debs[@]}" >/dev/null 2>&1); then
    # stale or missing package lists: refresh them (root only) and try once more
    if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
    (cd "$tmp" && apt-get download "${debs[@]}") || {
      echo "error: apt-get download ${debs[*]} failed (Debian bookworm's packages are needed)" >&2
      exit 1
    }
  fi
  rm -rf "$OCLOC_DIR.partial"
  mkdir -p "$OCLOC_DIR.partial"
  for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$OCLOC_DIR.partial/root"; done
  root="$OCLOC_DIR.partial/root"
  bin="$(find "$root" -name 'ocloc*' -type f -perm -u+x | head -n1)"
  [ -n "$bin" ] || { echo "error: no ocloc binary in ${debs[0]}" >&2; exit 1; }
  libdirs="$(find "$root" -path '*/lib/*' -name 'lib*.so*' -printf '%h\n' | sort -u | tr '\n' ':')"
  # A wrapper that finds the private libraries (the ICD libraries' names are loaded at run time too).
  cat > "$OCLOC_DIR.partial/ocloc" <<EOF
#!/bin/sh
here="\$(cd "\$(dirname "\$0")" && pwd)"
LD_LIBRARY_PATH="$(echo "$libdirs" | sed "s#$OCLOC_DIR.partial#\$here#g")\${LD_LIBRARY_PATH:-}" exec "\$here/${bin#"$OCLOC_DIR.partial/"}" "\$@"
EOF
  chmod +x "$OCLOC_DIR.partial/ocloc"
  rm -rf "$OCLOC_DIR"
  mv "$OCLOC_DIR.partial" "$OCLOC_DIR"
fi
"$OCLOC_DIR/ocloc" --help >/dev/null 2>&1 || { echo "error: $OCLOC_DIR/ocloc does not run" >&2; exit 1; }
echo "ocloc ready: $OCLOC_DIR/ocloc ($(du -sh "$OCLOC_DIR" | cut -f1))"
echo "aot toolchain ready: $VENV ($(du -sh "$VENV" | cut -f1))"
