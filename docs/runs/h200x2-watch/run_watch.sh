#!/usr/bin/env bash
# Does the GPU watch alone tell the faults apart? ppscope's PP loop on 2 GPUs under steady load
# (one point, 45 s of decode, no profiler) with `ppscope sglang --watch` sampling NVML beside it,
# once per setting: even admission (clean), SGLang's admission (the herd), CUDA graphs off, and
# GPU 1 shared with another process's matmuls. Then `ppscope report` reads each watch record
# alone (no traces, no logs). From the repo root on a 2-GPU machine:
#   bash docs/runs/h200x2-watch/run_watch.sh OUTDIR
# The recorded cases in docs/ predate the probe's SGLang-shaped loop (docs/runs/h200x2/README.md,
# "Which probe"); this script runs today's probe.
set -u
OUT=${1:?usage: run_watch.sh OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
COMMON=(--device cuda --pp 2 --work moe --layers-per-stage 2 --concurrency 32 --seconds 45 --timeout 170)
case_run() {  # case_run CASE [dispatch flags...]
  local case=$1; shift
  mkdir -p "$OUT/$case"
  $PY -m reports.cli sglang --watch 75 --watch-hz 10 --json "$OUT/$case/watch.json" \
    >"$OUT/$case/watch.log" 2>&1 &
  local w=$!
  timeout 180 $PY -m reports.cli dispatch "${COMMON[@]}" --json "$OUT/$case/dispatch.json" "$@" \
    >"$OUT/$case/dispatch.log" 2>&1
  echo "== $case rc=$? $(date +%T)"
  wait $w
  $PY -m reports.cli report --results "$OUT/$case" --out "$OUT/$case" >/dev/null 2>&1
  $PY - "$OUT/$case" <<'PYX'
import json, sys
r = json.load(open(sys.argv[1] + "/report.json"))
w = (r.get("watch") or {}).get("summary") or {}
print("  hints:", [(h["name"], h["holds"]) for h in w.get("hints", [])])
print("  k busy:", w.get("k_busy_frac"), " lags:", w.get("lags"))
PYX
}
case_run even --policies even
case_run herd --policies sglang
case_run graphs-off --policies even --no-graphs
$PY docs/runs/gpu_matmul_load.py cuda:1 120 &
HOG=$!
sleep 5
case_run gpu1-shared --policies even
kill $HOG 2>/dev/null; wait $HOG 2>/dev/null
