#!/usr/bin/env bash
# Before/after on one machine in one run: `paged bench decode-1` and `throughput --num-requests 64`, alternating
# between an older commit (a git worktree put first on PYTHONPATH, with this checkout's built cpu kernels) and the
# checkout, ROUNDS times. For changes that should not move performance (refactors): the pairs should agree within
# the spread of either side.
#
#   bash benchmarks/before_after.sh BASE_COMMIT [OUT_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${1:?usage: before_after.sh BASE_COMMIT [OUT_DIR] [ROUNDS]}"
OUT="${2:-/tmp/paged-before-after}"
ROUNDS="${3:-2}"
TREE="$(mktemp -d)/before"
git worktree add -f --detach "$TREE" "$BASE" >/dev/null
trap 'git worktree remove --force "$TREE"' EXIT
# The kernels are not in git: the base commit runs this checkout's build (same sources where the diff spares them).
cp backends/cpu/src/paged_backend_cpu/_C*.so "$TREE/backends/cpu/src/paged_backend_cpu/"
SRC=()
for d in core/src backends/*/src plugins/*/src; do SRC+=("$TREE/$d"); done
BEFORE_PATH="$(IFS=:; echo "${SRC[*]}")"
mkdir -p "$OUT"
run() {  # run NAME WORKLOAD ROUND [ENV...]
  local name="$1" wl="$2" i="$3" args=()
  shift 3
  [ "$wl" = throughput ] && args=(--num-requests 64)
  env "$@" .venv/bin/paged bench "$wl" "${args[@]}" --no-progress --json "$OUT/$name-$wl-$i.json" \
    >"$OUT/$name-$wl-$i.log" 2>&1
}
for i in $(seq "$ROUNDS"); do
  for wl in decode-1 throughput; do
    run before "$wl" "$i" PYTHONPATH="$BEFORE_PATH"
    run after "$wl" "$i"
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    r = json.load(open(f))["runs"][0]
    print(f"{os.path.basename(f):28s} out tok/s {r['output_tok_s']:8.1f}  TTFT p50 {r['ttft_s']['p50']:7.3f} s")
PY
