#!/usr/bin/env bash
# Diagnose every case of run_matrix.sh from its evidence only: the per-rank traces, the
# SGLang-format logs and the run's tok/s (as a user passes bench_serving's figure). No GPU needed.
# STAGE_COST=docs/runs/h200x2/stage_cost.json adds a measured MoE-layer curve (same GPU kind) as
# the shape for micro-batch sizes the traces never ran.
#   bash docs/runs/h200x2-faults/diagnose_matrix.sh OUTDIR
set -u
OUT=${1:?usage: diagnose_matrix.sh OUTDIR}
PY=${PYTHON:-python3}
for d in "$OUT"/*/; do
  case=$(basename "$d")
  for tr in "$d"traces/*-TP-0-PP-0.trace.json.gz; do
    [ -e "$tr" ] || continue
    pid=$(basename "$tr" -TP-0-PP-0.trace.json.gz)   # dispatch-POLICY-ARRIVAL-cC
    c=${pid##*-c}
    pol=$(echo "$pid" | cut -d- -f2)
    res="$d/diag-$pol-c$c"
    mkdir -p "$res"
    tok=$($PY -c "import json,sys; d=json.load(open('$d/dispatch.json'))['data']; print(next(r['tok_per_s'] for r in d['runs'] if r['policy']=='$pol' and r['concurrency']==$c))")
    $PY -m reports.cli sglang --traces "$d"traces/$pid-TP-0-PP-*.trace.json.gz \
      --log "$d"traces/$pid-TP-0-PP-*.log --model kimi-k2 --concurrency "$c" --link-gbps 390 \
      --json "$res/sglang.json" >/dev/null 2>"$res/sglang.err"
    [ -n "${STAGE_COST:-}" ] && cp "$STAGE_COST" "$res/stage_cost.json"
    # every run but the clean one is also compared with the clean run at its C (`--baseline`):
    # what the fault changed, per cause (the clean runs, base/even, are read first)
    bl=()
    clean="$OUT/base/diag-even-c$c/report.json"
    [ "$case/$pol" != base/even ] && [ -e "$clean" ] && bl=(--baseline "$clean")
    $PY -m reports.cli report --results "$res" --observed "$c:$tok" "${bl[@]}" >/dev/null \
      2>"$res/report.err"
    if [ -e "$d/dispatch_noprof.json" ]; then   # the same traces against an unprofiled tok/s
      tok2=$($PY -c "import json,sys; d=json.load(open('$d/dispatch_noprof.json'))['data']; print(next(r['tok_per_s'] for r in d['runs'] if r['policy']=='$pol' and r['concurrency']==$c))")
      mkdir -p "$res-noprof" && cp "$res/sglang.json" "$res-noprof/"
      $PY -m reports.cli report --results "$res-noprof" --observed "$c:$tok2" >/dev/null \
        2>"$res-noprof/report.err"
      echo "$case $pol C=$c unprofiled tok/s=$tok2 :: $($PY -c "import json; r=json.load(open('$res-noprof/report.json'))['diagnosis']; print('cpu scale', r.get('cpu_scale'), '|', r.get('corrected_answer'))")"
    fi
    echo "$case $pol C=$c tok/s=$tok :: $($PY -c "import json; r=json.load(open('$res/report.json')); print((r.get('diagnosis') or {}).get('answer'), '||', (r.get('baseline_comparison') or {}).get('answer'))")"
  done
done
