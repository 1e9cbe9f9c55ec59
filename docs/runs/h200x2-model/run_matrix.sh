#!/usr/bin/env bash
# Model vs probe in SGLang's loop order (issue 11): the PP-loop probe on 2 GPUs at async depth
# 0, pp and 2*pp, eager and CUDA graphs, C = 1/8/32/64, SGLang's admission (burst; 1000-token
# prompts, chunked prefill 8192) and the even policy; then the same at depth pp with each fault
# switch. Every record is then checked against the pipeline model rebuilt from the record alone
# (reports/model/checks/validate_dispatch.py; target: within 10% at every point). From the repo root:
#   bash docs/runs/h200x2-model/run_matrix.sh OUTDIR
# The recorded cases in docs/ predate the probe's SGLang-shaped loop (docs/runs/h200x2/README.md,
# "Which probe"); this script runs today's probe.
set -u
OUT=${1:?usage: run_matrix.sh OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
COMMON=(--device cuda --pp 2 --work moe --layers-per-stage 2 --concurrency 1,8,32,64 --policies sglang,even
        --prompt-len 1000 --chunked-prefill-size 8192 --seconds 1 --timeout 580)
run() {  # run CASE [extra dispatch flags...]
  local case=$1; shift
  echo "== $case: $*" | tee -a "$OUT/matrix.log"
  timeout 600 $PY -m reports.cli dispatch "${COMMON[@]}" --json "$OUT/$case.json" "$@" \
    >>"$OUT/matrix.log" 2>&1
  echo "   rc=$? $(date +%T)" | tee -a "$OUT/matrix.log"
}
for depth in 0 2 4; do
  run "d$depth-graphs" --async-depth "$depth"
  run "d$depth-eager" --async-depth "$depth" --no-graphs
done
run d2-slow-stage --async-depth 2 --inject slow-stage=1:1.5
run d2-host-delay --async-depth 2 --inject host-delay=0:1000
run d2-hop-delay --async-depth 2 --inject hop-delay=500
$PY -m reports.model.checks.validate_dispatch "$OUT"/*.json | tee "$OUT/validate.txt"
