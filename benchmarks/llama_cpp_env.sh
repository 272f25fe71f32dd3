#!/usr/bin/env bash
# Build (or reuse) llama.cpp's `llama-bench`, for the optional `paged bench decode-1 --baseline llama.cpp`.
# Never part of CI.
#
#   PAGED_LLAMA_CPP_DIR  the cache (default: $HOME/.cache/paged/llama.cpp); the binary lands in
#                        $PAGED_LLAMA_CPP_DIR/<version>/bin/llama-bench
#   PAGED_VENV           paged's environment, whose pip downloads the source (default: .venv; else python3)
#   JOBS                 parallel compile jobs (default: 2)
#
# The source is the llama.cpp that the pinned llama-cpp-python sdist from PyPI vendors
# (vendor/llama.cpp), built with CMake (Release, -march=native, static libraries, no server, tests,
# examples, UI or HTTPS) for the `llama-bench` target only. Nothing is done when the binary exists.
# An interrupted build resumes: its work folder ($PAGED_LLAMA_CPP_DIR/<version>/work) is kept until
# the binary is installed. 10-25 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="0.3.36"   # llama-cpp-python; the newest on PyPI when this was written
ROOT="${PAGED_LLAMA_CPP_DIR:-$HOME/.cache/paged/llama.cpp}"
DEST="$ROOT/$VERSION"
BIN="$DEST/bin/llama-bench"
JOBS="${JOBS:-2}"

if [ -x "$BIN" ]; then
  echo "llama-bench ready: $BIN"
  exit 0
fi
for tool in cmake c++ cc; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (Debian: apt-get install cmake build-essential)" >&2; exit 1; }
done
PY="${PAGED_VENV:-.venv}/bin/python"
[ -x "$PY" ] || PY=python3

WORK="$DEST/work"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
mkdir -p "$WORK"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  DL="$(mktemp -d)"
  trap 'rm -rf "$DL"' EXIT
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$DL"
  rm -rf "$WORK/llama_cpp_python-$VERSION"
  tar -xzf "$DL/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
  [ -f "$SRC/CMakeLists.txt" ] || { echo "error: the sdist holds no vendor/llama.cpp" >&2; exit 1; }
fi

# Options checked against this version's CMakeLists: LLAMA_CURL is deprecated and ignored here (HTTPS
# downloads go through cpp-httplib, so LLAMA_OPENSSL=OFF is what keeps them out); LLAMA_USE_PREBUILT_UI
# only matters with the server. Static libraries, so that the one installed binary runs on its own.
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DGGML_CCACHE=OFF
cmake --build "$WORK/build" --target llama-bench -j "$JOBS"

mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-bench" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --help >/dev/null
rm -rf "$WORK"
echo "llama-bench ready: $BIN"
